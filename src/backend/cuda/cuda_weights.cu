/* The CUDA backend's weights on the device (the core's, cuda_core.cuh): every matrix as bf16 (F16 / F32 checkpoints
 * converted on the host, FP8 checkpoints dequantized on the host as quant/fp8_weights.h specifies), every norm
 * vector as fp32, all in one allocation laid out by cuda_weight_layout.h; and the RoPE table.
 * With --weights fp8 the linear layers are held as E4M3 codes with 128x128 block scales, the values the CPU backend
 * computes on in that mode (quant/fp8_weights.h): a BF16 checkpoint's matrices quantized on the device from their
 * bf16 upload (kernels/fp8_weights.cu, bit for bit quant/fp8.c), an F16 / F32 one's on the host by quant/fp8.c from
 * their float values, an FP8 checkpoint's codes and scales kept as stored (128x128 blocks only). The embedding and
 * the lm_head stay bf16 in both modes, as on the CPU: the lm_head is not among the layers Qwen's FP8 checkpoints
 * quantize, and the greedy lm_head screen reads it as bf16. */
#include "backend/cuda/cuda_core.cuh"
#include "backend/cuda_weight_layout.h"
#include "model/rope.h"
#include "quant/fp8.h"
#include "quant/fp8_weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

namespace {

kite_status check_view(const tensor_view *t, int64_t rows, int64_t cols, const char *what, int layer) {
    const bool ok = t->data && ((cols == 0 && t->n_dims == 1 && t->shape[0] == rows) ||
                                (cols > 0 && t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols));
    if (!ok)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: layer %d %s has shape (%lld, %lld), expected (%lld, %lld)",
                         layer, what, (long long)t->shape[0], (long long)(t->n_dims == 2 ? t->shape[1] : 0),
                         (long long)rows, (long long)cols);
    return KITE_OK;
}

/* An F8_E4M3 matrix dequantized (q x scale_inv in float32) and rounded to bf16, a band of whole rows at a time:
 * the same bf16 values the CPU backend computes on for this checkpoint with --weights bf16. */
kite_status upload_fp8_matrix(bf16 *dst, const tensor_view *t, float *staging_f32, uint16_t *staging_bf16,
                              size_t staging_elements) {
    KITE_TRY(fp8_weights_check_view(t, "(cuda upload)"));
    const int64_t rows = t->shape[0], cols = t->shape[1];
    const int64_t band = cols > 0 ? (int64_t)(staging_elements / (size_t)cols) : rows;
    if (band < 1)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "cuda backend: an fp8 matrix of %lld columns exceeds the staging buffer", (long long)cols);
    for (int64_t row = 0; row < rows; row += band) {
        const int64_t end = row + band < rows ? row + band : rows;
        const size_t count = (size_t)(end - row) * (size_t)cols;
        fp8_weights_dequantize_rows(t, row, end, staging_f32);
        for (size_t i = 0; i < count; i++) staging_bf16[i] = float_to_bf16(staging_f32[i]);
        CUDA_CHECK(cudaMemcpy(dst + (size_t)row * (size_t)cols, staging_bf16, count * sizeof(uint16_t),
                              cudaMemcpyHostToDevice));
    }
    return KITE_OK;
}

/* Copies a matrix to bf16 device memory, converting F16 / F32 / F8_E4M3 on the host through `staging`. */
kite_status upload_matrix(bf16 *dst, const tensor_view *t, float *staging_f32, uint16_t *staging_bf16,
                          size_t staging_elements) {
    if (t->dtype == TENSOR_DTYPE_F8_E4M3) return upload_fp8_matrix(dst, t, staging_f32, staging_bf16, staging_elements);
    const size_t n = tensor_view_elements(t);
    if (t->dtype == TENSOR_DTYPE_BF16) {
        CUDA_CHECK(cudaMemcpy(dst, t->data, n * sizeof(uint16_t), cudaMemcpyHostToDevice));
        return KITE_OK;
    }
    const size_t element = tensor_dtype_size(t->dtype);
    for (size_t done = 0; done < n; done += staging_elements) {
        const size_t count = n - done < staging_elements ? n - done : staging_elements;
        tensor_to_float(t->dtype, static_cast<const unsigned char *>(t->data) + done * element, staging_f32, count);
        for (size_t i = 0; i < count; i++) staging_bf16[i] = float_to_bf16(staging_f32[i]);
        CUDA_CHECK(cudaMemcpy(dst + done, staging_bf16, count * sizeof(uint16_t), cudaMemcpyHostToDevice));
    }
    return KITE_OK;
}

/* Where one source matrix (q_proj, up_proj, ...) lands in its fused fp8 piece: its first row's codes and its first
 * block row's scales (the source starts at a multiple of 128 rows: cuda_weight_layout_make checked). */
struct fp8_destination {
    uint8_t *codes;
    float *scales;
    const char *name; /* "q_proj", ... */
    int layer;
};

/* A BF16 matrix uploaded to `device_bf16` and quantized into dst, both on the core's stream; synchronised before it
 * returns, since the next matrix reuses device_bf16. The upload is on the core's stream, not cudaMemcpy's legacy
 * default stream: the core's stream is non-blocking, so nothing orders it after a legacy-stream copy, and a
 * cudaMemcpy from pageable memory returns once the bytes are staged, before their DMA to the device has ended; the
 * quantization would then read device_bf16 partly stale (the previous matrix's values). In one stream the copy's DMA
 * ends before the kernel starts. */
kite_status quantize_bf16_on_device(const cuda_core *core, const fp8_destination &dst, const tensor_view *t,
                                    bf16 *device_bf16) {
    const int64_t rows = t->shape[0], cols = t->shape[1];
    CUDA_CHECK(cudaMemcpyAsync(device_bf16, t->data, (size_t)rows * (size_t)cols * sizeof(uint16_t),
                               cudaMemcpyHostToDevice, core->stream));
    CUDA_CHECK(cudaMemsetAsync(core->fp8_nonfinite, 0, sizeof(int), core->stream));
    KITE_TRY(cuda_fp8_quantize_weight(device_bf16, (int)rows, (int)cols, dst.codes, dst.scales,
                                      cuda_weight_layout_scale_cols(cols), core->fp8_nonfinite, core->stream));
    int nonfinite = 0;
    CUDA_CHECK(cudaMemcpyAsync(&nonfinite, core->fp8_nonfinite, sizeof nonfinite, cudaMemcpyDeviceToHost,
                               core->stream));
    CUDA_CHECK(cudaStreamSynchronize(core->stream));
    if (nonfinite)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "layer %d %s: a weight is not finite; a weight quantized to fp8 must be finite", dst.layer,
                         dst.name);
    return KITE_OK;
}

/* An F16 / F32 matrix widened and quantized on the host by quant/fp8.c (its float values, as the CPU backend
 * quantizes them), then the codes and scales uploaded. */
kite_status quantize_on_host(const fp8_destination &dst, const tensor_view *t) {
    const int64_t rows = t->shape[0], cols = t->shape[1];
    const size_t n = (size_t)rows * (size_t)cols;
    const size_t n_scales =
        (size_t)fp8_block_count(rows, FP8_BLOCK_SIZE) * (size_t)fp8_block_count(cols, FP8_BLOCK_SIZE);
    float *values = static_cast<float *>(malloc(n * sizeof(float)));
    uint8_t *codes = static_cast<uint8_t *>(malloc(n));
    float *scales = static_cast<float *>(malloc(n_scales * sizeof(float)));
    kite_status status = KITE_OK;
    if (!values || !codes || !scales)
        status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cuda backend: out of host memory quantizing layer %d %s",
                           dst.layer, dst.name);
    if (status == KITE_OK) {
        char name[64];
        snprintf(name, sizeof name, "layer %d %s", dst.layer, dst.name);
        tensor_to_float(t->dtype, t->data, values, n);
        status = fp8_quantize_blocks(values, rows, cols, codes, scales, name);
    }
    if (status == KITE_OK) status = cuda_status(cudaMemcpy(dst.codes, codes, n, cudaMemcpyHostToDevice), "cudaMemcpy");
    if (status == KITE_OK)
        status = cuda_status(cudaMemcpy(dst.scales, scales, n_scales * sizeof(float), cudaMemcpyHostToDevice),
                             "cudaMemcpy");
    free(values);
    free(codes);
    free(scales);
    return status;
}

/* An F8_E4M3 matrix's stored codes as they are, and its scales widened to float32 (exact from F32 or BF16). */
kite_status upload_stored_fp8(const fp8_destination &dst, const tensor_view *t) {
    KITE_TRY(fp8_weights_check_view(t, dst.name));
    if (t->block_rows != FP8_BLOCK_SIZE || t->block_cols != FP8_BLOCK_SIZE)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "cuda backend: layer %d %s has %dx%d scale blocks; --weights fp8 on CUDA keeps stored codes "
                         "only with 128x128 blocks (use --weights bf16)",
                         dst.layer, dst.name, (int)t->block_rows, (int)t->block_cols);
    const int64_t rows = t->shape[0], cols = t->shape[1];
    const size_t n_scales =
        (size_t)fp8_block_count(rows, FP8_BLOCK_SIZE) * (size_t)fp8_block_count(cols, FP8_BLOCK_SIZE);
    float *scales = static_cast<float *>(malloc(n_scales * sizeof(float)));
    if (!scales) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cuda backend: out of host memory for fp8 scales");
    tensor_to_float(t->scale_dtype, t->scale_inv, scales, n_scales);
    kite_status status =
        cuda_status(cudaMemcpy(dst.codes, t->data, (size_t)rows * (size_t)cols, cudaMemcpyHostToDevice), "cudaMemcpy");
    if (status == KITE_OK)
        status = cuda_status(cudaMemcpy(dst.scales, scales, n_scales * sizeof(float), cudaMemcpyHostToDevice),
                             "cudaMemcpy");
    free(scales);
    return status;
}

kite_status upload_fp8_matrix_as_codes(const cuda_core *core, const fp8_destination &dst, const tensor_view *t,
                                       bf16 *device_bf16) {
    switch (t->dtype) {
    case TENSOR_DTYPE_F8_E4M3: return upload_stored_fp8(dst, t);
    case TENSOR_DTYPE_BF16: return quantize_bf16_on_device(core, dst, t, device_bf16);
    default: return quantize_on_host(dst, t);
    }
}

kite_status upload_vector(float *dst, const tensor_view *t, float *staging_f32) {
    if (t->dtype == TENSOR_DTYPE_F8_E4M3)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: a norm vector stored in fp8");
    const size_t n = tensor_view_elements(t);
    tensor_to_float(t->dtype, t->data, staging_f32, n);
    CUDA_CHECK(cudaMemcpy(dst, staging_f32, n * sizeof(float), cudaMemcpyHostToDevice));
    return KITE_OK;
}

} // namespace

kite_status place_weights(cuda_core *core, bool tied) {
    const qwen3_config *c = &core->config;
    const bool fp8 = core->weights == KITE_WEIGHTS_FP8;
    cuda_weight_layout layout;
    KITE_TRY(cuda_weight_layout_make(c, tied, core->weights, &layout));
    core->layers = static_cast<cuda_layer *>(calloc((size_t)c->n_layers, sizeof(cuda_layer)));
    if (!core->layers) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cuda backend: out of host memory");
    CUDA_CHECK(cudaMalloc(&core->weight_bytes, layout.total));
    core->weight_total = layout.total;
    unsigned char *base = static_cast<unsigned char *>(core->weight_bytes);
    core->embed = reinterpret_cast<bf16 *>(base + layout.embed);
    core->lm_head = reinterpret_cast<bf16 *>(base + layout.lm_head);
    core->final_norm = reinterpret_cast<float *>(base + layout.final_norm);
    for (int l = 0; l < c->n_layers; l++) {
        unsigned char *at = base + layout.first_layer + (size_t)l * layout.layer_bytes;
        cuda_layer *L = &core->layers[l];
        if (fp8) {
            L->qkv_q = at + layout.layer.qkv;
            L->o_q = at + layout.layer.o;
            L->gate_up_q = at + layout.layer.gate_up;
            L->down_q = at + layout.layer.down;
            L->qkv_scale = reinterpret_cast<float *>(at + layout.layer.qkv_scale);
            L->o_scale = reinterpret_cast<float *>(at + layout.layer.o_scale);
            L->gate_up_scale = reinterpret_cast<float *>(at + layout.layer.gate_up_scale);
            L->down_scale = reinterpret_cast<float *>(at + layout.layer.down_scale);
        } else {
            L->qkv = reinterpret_cast<bf16 *>(at + layout.layer.qkv);
            L->o = reinterpret_cast<bf16 *>(at + layout.layer.o);
            L->gate_up = reinterpret_cast<bf16 *>(at + layout.layer.gate_up);
            L->down = reinterpret_cast<bf16 *>(at + layout.layer.down);
        }
        L->input_norm = reinterpret_cast<float *>(at + layout.layer.input_norm);
        L->post_norm = reinterpret_cast<float *>(at + layout.layer.post_norm);
        L->q_norm = reinterpret_cast<float *>(at + layout.layer.q_norm);
        L->k_norm = reinterpret_cast<float *>(at + layout.layer.k_norm);
    }
    if (fp8) {
        const size_t hidden = (size_t)c->hidden_size, inter = (size_t)c->intermediate_size;
        const size_t layer_elements = (size_t)qwen3_qkv_dim(c) * hidden + hidden * (size_t)qwen3_q_dim(c) +
                                      2 * inter * hidden + hidden * inter;
        CUDA_CHECK(cudaMalloc(&core->fp8_scratch, layer_elements * sizeof(bf16)));
        CUDA_CHECK(cudaMalloc(&core->fp8_nonfinite, sizeof(int)));
        KITE_TRY(fp8_prefetch_create(core, layer_elements));
    }
    return KITE_OK;
}

void fp8_layer_view(const cuda_core *core, int l, bf16 *dst, cuda_layer *view) {
    const qwen3_config *c = &core->config;
    const size_t hidden = (size_t)c->hidden_size, inter = (size_t)c->intermediate_size;
    *view = core->layers[l];
    view->qkv = dst;
    view->o = view->qkv + (size_t)qwen3_qkv_dim(c) * hidden;
    view->gate_up = view->o + hidden * (size_t)qwen3_q_dim(c);
    view->down = view->gate_up + 2 * inter * hidden;
}

kite_status fp8_layer_dequantize(const cuda_core *core, int l, const cuda_layer *view, cudaStream_t stream) {
    const qwen3_config *c = &core->config;
    const int hidden = c->hidden_size, inter = c->intermediate_size, qd = qwen3_q_dim(c), qkv_dim = qwen3_qkv_dim(c);
    const int hidden_scales = cuda_weight_layout_scale_cols(hidden);
    const cuda_layer *L = &core->layers[l];
    KITE_TRY(cuda_fp8_dequantize_weight(L->qkv_q, L->qkv_scale, hidden_scales, qkv_dim, hidden, view->qkv, stream));
    KITE_TRY(cuda_fp8_dequantize_weight(L->o_q, L->o_scale, cuda_weight_layout_scale_cols(qd), hidden, qd, view->o,
                                        stream));
    KITE_TRY(cuda_fp8_dequantize_weight(L->gate_up_q, L->gate_up_scale, hidden_scales, 2 * inter, hidden,
                                        view->gate_up, stream));
    KITE_TRY(cuda_fp8_dequantize_weight(L->down_q, L->down_scale, cuda_weight_layout_scale_cols(inter), hidden,
                                        inter, view->down, stream));
    return KITE_OK;
}

kite_status layer_for_gemm(const cuda_core *core, int l, cuda_layer *scratch, const cuda_layer **out) {
    if (core->weights != KITE_WEIGHTS_FP8) {
        *out = &core->layers[l];
        return KITE_OK;
    }
    fp8_layer_view(core, l, core->fp8_scratch, scratch);
    KITE_TRY(fp8_layer_dequantize(core, l, scratch, core->stream));
    *out = scratch;
    return KITE_OK;
}

kite_status upload_weights(cuda_core *core, const qwen3_weights *w) {
    const qwen3_config *c = &core->config;
    const int64_t hidden = c->hidden_size, inter = c->intermediate_size, hd = c->head_dim;
    const int64_t q_rows = qwen3_q_dim(c), kv_rows = qwen3_kv_dim(c);
    const bool tied = w->lm_head.data == w->embed_tokens.data;

    KITE_TRY(check_view(&w->embed_tokens, c->vocab_size, hidden, "embed_tokens", -1));
    KITE_TRY(check_view(&w->lm_head, c->vocab_size, hidden, "lm_head", -1));
    KITE_TRY(check_view(&w->final_norm, hidden, 0, "norm", -1));
    for (int l = 0; l < c->n_layers; l++) {
        const qwen3_layer_weights *lw = &w->layers[l];
        KITE_TRY(check_view(&lw->input_norm, hidden, 0, "input_layernorm", l));
        KITE_TRY(check_view(&lw->q_proj, q_rows, hidden, "q_proj", l));
        KITE_TRY(check_view(&lw->k_proj, kv_rows, hidden, "k_proj", l));
        KITE_TRY(check_view(&lw->v_proj, kv_rows, hidden, "v_proj", l));
        KITE_TRY(check_view(&lw->q_norm, hd, 0, "q_norm", l));
        KITE_TRY(check_view(&lw->k_norm, hd, 0, "k_norm", l));
        KITE_TRY(check_view(&lw->o_proj, hidden, q_rows, "o_proj", l));
        KITE_TRY(check_view(&lw->post_attention_norm, hidden, 0, "post_attention_layernorm", l));
        KITE_TRY(check_view(&lw->gate_proj, inter, hidden, "gate_proj", l));
        KITE_TRY(check_view(&lw->up_proj, inter, hidden, "up_proj", l));
        KITE_TRY(check_view(&lw->down_proj, hidden, inter, "down_proj", l));
    }

    KITE_TRY(place_weights(core, tied));

    const size_t staging_elements = 1u << 22;
    float *staging_f32 = static_cast<float *>(malloc(staging_elements * sizeof(float)));
    uint16_t *staging_bf16 = static_cast<uint16_t *>(malloc(staging_elements * sizeof(uint16_t)));
    kite_status status = KITE_OK;
    if (!staging_f32 || !staging_bf16) status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cuda backend: out of host memory");
    /* --weights fp8: the device copy of one bf16 source matrix that the quantization reads (the largest source). */
    const bool fp8 = core->weights == KITE_WEIGHTS_FP8;
    bf16 *device_bf16 = NULL;
    cuda_weight_layout fp8_layout;
    cuda_fp8_source_place fp8_places[CUDA_FP8_SOURCES];
    if (fp8 && status == KITE_OK) status = cuda_weight_layout_make(c, tied, core->weights, &fp8_layout);
    if (fp8 && status == KITE_OK) status = cuda_weight_layout_fp8_sources(&fp8_layout, c, fp8_places);
    if (fp8 && status == KITE_OK) {
        int64_t largest = q_rows * hidden;
        if (inter * hidden > largest) largest = inter * hidden;
        status = cuda_status(cudaMalloc(&device_bf16, (size_t)largest * sizeof(bf16)), "cudaMalloc");
    }
#define UPLOAD(expr)                                                                                     \
    if (status == KITE_OK) status = (expr)
    UPLOAD(upload_matrix(core->embed, &w->embed_tokens, staging_f32, staging_bf16, staging_elements));
    if (!tied) UPLOAD(upload_matrix(core->lm_head, &w->lm_head, staging_f32, staging_bf16, staging_elements));
    UPLOAD(upload_vector(core->final_norm, &w->final_norm, staging_f32));
    for (int l = 0; l < c->n_layers && status == KITE_OK; l++) {
        const qwen3_layer_weights *lw = &w->layers[l];
        cuda_layer *L = &core->layers[l];
        if (fp8) {
            unsigned char *at = static_cast<unsigned char *>(core->weight_bytes) + fp8_layout.first_layer +
                                (size_t)l * fp8_layout.layer_bytes;
            const tensor_view *sources[CUDA_FP8_SOURCES] = {&lw->q_proj,    &lw->k_proj,  &lw->v_proj,  &lw->o_proj,
                                                            &lw->gate_proj, &lw->up_proj, &lw->down_proj};
            for (int i = 0; i < CUDA_FP8_SOURCES; i++) {
                const fp8_destination dst = {at + fp8_places[i].codes,
                                             reinterpret_cast<float *>(at + fp8_places[i].scales), fp8_places[i].name,
                                             l};
                UPLOAD(upload_fp8_matrix_as_codes(core, dst, sources[i], device_bf16));
            }
        } else {
            UPLOAD(upload_matrix(L->qkv, &lw->q_proj, staging_f32, staging_bf16, staging_elements));
            UPLOAD(upload_matrix(L->qkv + (size_t)q_rows * hidden, &lw->k_proj, staging_f32, staging_bf16,
                                 staging_elements));
            UPLOAD(upload_matrix(L->qkv + (size_t)(q_rows + kv_rows) * hidden, &lw->v_proj, staging_f32, staging_bf16,
                                 staging_elements));
            UPLOAD(upload_matrix(L->o, &lw->o_proj, staging_f32, staging_bf16, staging_elements));
            UPLOAD(upload_matrix(L->gate_up, &lw->gate_proj, staging_f32, staging_bf16, staging_elements));
            UPLOAD(upload_matrix(L->gate_up + (size_t)inter * hidden, &lw->up_proj, staging_f32, staging_bf16,
                                 staging_elements));
            UPLOAD(upload_matrix(L->down, &lw->down_proj, staging_f32, staging_bf16, staging_elements));
        }
        UPLOAD(upload_vector(L->input_norm, &lw->input_norm, staging_f32));
        UPLOAD(upload_vector(L->post_norm, &lw->post_attention_norm, staging_f32));
        UPLOAD(upload_vector(L->q_norm, &lw->q_norm, staging_f32));
        UPLOAD(upload_vector(L->k_norm, &lw->k_norm, staging_f32));
    }
#undef UPLOAD
    if (device_bf16) {
        const kite_status freed = cuda_status(cudaFree(device_bf16), "cudaFree");
        if (status == KITE_OK) status = freed;
    }
    free(staging_f32);
    free(staging_bf16);
    return status;
}

/* The RoPE table of every position up to the context limit, built by model/rope.c as the CPU backend builds
 * its angles (YaRN's frequencies and attention factor included), so the two backends rotate alike. */
kite_status upload_rope(cuda_core *core) {
    const qwen3_config *c = &core->config;
    const int half = c->head_dim / 2;
    const int32_t positions = qwen3_context_limit(c);
    const size_t n = (size_t)positions * (size_t)half;
    float *cos_host = static_cast<float *>(malloc(n * sizeof(float)));
    float *sin_host = static_cast<float *>(malloc(n * sizeof(float)));
    float *inv_freq = static_cast<float *>(malloc((size_t)half * sizeof(float)));
    if (!cos_host || !sin_host || !inv_freq) {
        free(cos_host);
        free(sin_host);
        free(inv_freq);
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cuda backend: out of host memory for the RoPE table");
    }
    rope_inv_freq(c, inv_freq);
    const float attention_factor = rope_attention_factor(c);
    for (int32_t p = 0; p < positions; p++)
        rope_position_angles(inv_freq, half, attention_factor, p, cos_host + (size_t)p * half,
                             sin_host + (size_t)p * half);
    free(inv_freq);
    kite_status status = KITE_OK;
    cudaError_t e1 = cudaMalloc(&core->rope_cos, n * sizeof(float));
    cudaError_t e2 = cudaMalloc(&core->rope_sin, n * sizeof(float));
    if (e1 == cudaSuccess && e2 == cudaSuccess) {
        e1 = cudaMemcpy(core->rope_cos, cos_host, n * sizeof(float), cudaMemcpyHostToDevice);
        e2 = cudaMemcpy(core->rope_sin, sin_host, n * sizeof(float), cudaMemcpyHostToDevice);
    }
    if (e1 != cudaSuccess || e2 != cudaSuccess)
        status = kite_fail(KITE_ERROR_BACKEND, "cuda: uploading the RoPE table failed: %s",
                           cudaGetErrorName(e1 != cudaSuccess ? e1 : e2));
    free(cos_host);
    free(sin_host);
    core->rope_positions = positions;
    return status;
}

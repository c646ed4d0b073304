/* The prefill path's fp8 layers, dequantized one layer ahead.
 *
 * With --weights fp8 every layer's four matrices must be bf16 before cuBLASLt multiplies them (W8A16), and the
 * dequantization is a memory-bound pass (1 byte read, 2 written per weight) while a prefill layer's products are
 * compute bound. In one stream the two add up (0.15 ms a layer on the 8B shape, 10% of pp2048); here layer l + 1
 * is dequantized on a side stream into the other of two scratches while layer l's products run, so the pass runs
 * under the products. Events order the buffers:
 *   ready[i]     recorded on the side stream when buffer i holds its layer: the main stream waits for it before
 *                the layer's first product;
 *   consumed[i]  recorded on the main stream after the last product that reads buffer i: the side stream waits
 *                for it before refilling i (two layers later);
 *   fork         recorded on the main stream when a prefill begins: the side stream starts after everything
 *                enqueued before it (the batched path reads buffer 0, core->fp8_scratch, on the main stream).
 * The main stream waits for layer n - 1's buffer before its products, so when the prefill's last layer ends the
 * side stream is idle: nothing of it outlives the step. The decode paths are captured in graphs and keep the
 * one-stream route (layer_for_gemm). */
#include "backend/cuda/cuda_core.cuh"
#include "backend/cuda_weight_layout.h"

namespace {

/* core->layers[l] with its four bf16 matrices pointed into dst (one layer's worth, laid out as the fused pieces). */
void view_layer(const cuda_core *core, int l, bf16 *dst, cuda_layer *view) {
    const qwen3_config *c = &core->config;
    const size_t hidden = (size_t)c->hidden_size, inter = (size_t)c->intermediate_size;
    *view = core->layers[l];
    view->qkv = dst;
    view->o = view->qkv + (size_t)qwen3_qkv_dim(c) * hidden;
    view->gate_up = view->o + hidden * (size_t)qwen3_q_dim(c);
    view->down = view->gate_up + 2 * inter * hidden;
}

/* Enqueues on `stream` the dequantization of layer l's codes into the matrices of `view` (view_layer's). */
kite_status dequantize_layer(const cuda_core *core, int l, const cuda_layer *view, cudaStream_t stream) {
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

bf16 *buffer(const cuda_core *core, int l) { return l % 2 == 0 ? core->fp8_scratch : core->fp8_prefetch.second; }

/* On the side stream: buffer (l % 2) refilled with layer l once its previous reader is done. */
kite_status enqueue_layer(const cuda_core *core, int l) {
    const fp8_prefetch_state *f = &core->fp8_prefetch;
    cuda_layer view;
    view_layer(core, l, buffer(core, l), &view);
    CUDA_CHECK(cudaStreamWaitEvent(f->side, f->consumed[l % 2], 0));
    KITE_TRY(dequantize_layer(core, l, &view, f->side));
    CUDA_CHECK(cudaEventRecord(f->ready[l % 2], f->side));
    return KITE_OK;
}

} // namespace

kite_status fp8_prefetch_create(cuda_core *core, size_t layer_elements) {
    fp8_prefetch_state *f = &core->fp8_prefetch;
    CUDA_CHECK(cudaMalloc(&f->second, layer_elements * sizeof(bf16)));
    CUDA_CHECK(cudaStreamCreateWithFlags(&f->side, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&f->fork, cudaEventDisableTiming));
    for (int i = 0; i < 2; i++) {
        CUDA_CHECK(cudaEventCreateWithFlags(&f->ready[i], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&f->consumed[i], cudaEventDisableTiming));
    }
    return KITE_OK;
}

void fp8_prefetch_free(cuda_core *core) {
    fp8_prefetch_state *f = &core->fp8_prefetch;
    if (f->side) cudaStreamSynchronize(f->side);
    cudaFree(f->second);
    if (f->fork) cudaEventDestroy(f->fork);
    for (int i = 0; i < 2; i++) {
        if (f->ready[i]) cudaEventDestroy(f->ready[i]);
        if (f->consumed[i]) cudaEventDestroy(f->consumed[i]);
    }
    if (f->side) cudaStreamDestroy(f->side);
    *f = fp8_prefetch_state{};
}

kite_status fp8_prefetch_begin(const cuda_core *core) {
    const fp8_prefetch_state *f = &core->fp8_prefetch;
    CUDA_CHECK(cudaEventRecord(f->fork, core->stream));
    CUDA_CHECK(cudaStreamWaitEvent(f->side, f->fork, 0));
    return enqueue_layer(core, 0);
}

kite_status fp8_prefetch_layer(const cuda_core *core, int l, cuda_layer *view, const cuda_layer **out) {
    const fp8_prefetch_state *f = &core->fp8_prefetch;
    CUDA_CHECK(cudaStreamWaitEvent(core->stream, f->ready[l % 2], 0));
    if (l + 1 < core->config.n_layers) KITE_TRY(enqueue_layer(core, l + 1));
    view_layer(core, l, buffer(core, l), view); /* its dequantization is enqueued already */
    *out = view;
    return KITE_OK;
}

kite_status fp8_prefetch_release(const cuda_core *core, int l) {
    CUDA_CHECK(cudaEventRecord(core->fp8_prefetch.consumed[l % 2], core->stream));
    return KITE_OK;
}

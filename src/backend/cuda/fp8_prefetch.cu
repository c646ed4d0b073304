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

namespace {

bf16 *buffer(const cuda_core *core, int l) { return l % 2 == 0 ? core->fp8_scratch : core->fp8_prefetch.second; }

/* On the side stream: buffer (l % 2) refilled with layer l once its previous reader is done. */
kite_status enqueue_layer(const cuda_core *core, int l) {
    const fp8_prefetch_state *f = &core->fp8_prefetch;
    cuda_layer view;
    fp8_layer_view(core, l, buffer(core, l), &view);
    CUDA_CHECK(cudaStreamWaitEvent(f->side, f->consumed[l % 2], 0));
    KITE_TRY(fp8_layer_dequantize(core, l, &view, f->side));
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
    fp8_layer_view(core, l, buffer(core, l), view); /* its dequantization is enqueued already */
    *out = view;
    return KITE_OK;
}

kite_status fp8_prefetch_release(const cuda_core *core, int l) {
    CUDA_CHECK(cudaEventRecord(core->fp8_prefetch.consumed[l % 2], core->stream));
    return KITE_OK;
}

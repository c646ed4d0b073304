/* The CUDA backend's weights to and from the weight cache (weights/weight_cache.h). What a cache entry holds is the
 * weight allocation itself, byte for byte (bf16 matrices in the fused qkv / gate_up layout, or with --weights fp8
 * their E4M3 codes and block scales; fp32 norms; laid out by cuda_weight_layout.h), cut into segments of at most
 * 1 GiB; the RoPE table, the lm_head's int8 screen and every other buffer are rebuilt at creation as from a
 * checkpoint. A load from an entry therefore skips the safetensors parse, the dequantization of FP8 checkpoints, the
 * conversion to bf16 and the fp8 quantization, and reads the bytes the upload would have written. The cache's key
 * names the weights mode, so a bf16 entry and an fp8 one of the same checkpoint are two entries. */
#include "backend/cuda/cuda_backend.cuh"
#include "backend/cuda_weight_layout.h"

#include <string.h>

namespace {

/* The export copies device bytes out through one pinned buffer of this size (the cache writer asks for one 16 MiB
 * chunk at a time). */
constexpr size_t EXPORT_STAGING_BYTES = (size_t)16 << 20;
/* The import stages about this much per read, in two buffers: a read of the entry overlaps the upload of the
 * previous one, and each read is long enough that per-call costs do not count. */
constexpr uint64_t IMPORT_PIECE_TARGET_BYTES = (uint64_t)64 << 20;

/* The layout the core's allocation was placed by. The allocation exists, so its config made a layout before. */
kite_status core_layout(const cuda_core *core, cuda_weight_layout *layout) {
    KITE_TRY(cuda_weight_layout_make(&core->config, core->lm_head == core->embed, core->weights, layout));
    if (layout->total != core->weight_total)
        return kite_fail(KITE_ERROR_BACKEND, "cuda backend: the weight allocation holds %llu bytes, its layout %llu",
                         (unsigned long long)core->weight_total, (unsigned long long)layout->total);
    return KITE_OK;
}

kite_status cuda_list_segments(backend *self, backend_segment *segments, int32_t capacity, int32_t *n) {
    const cuda_core *core = &as_cuda(self)->core;
    /* An entry is read back by the layout config.json implies: a model whose lm_head is shared or not against what
     * tie_word_embeddings says (random weights drawn independently) has no such layout, and is not exported. */
    if (core->config.tie_word_embeddings != (core->lm_head == core->embed))
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda backend: its lm_head and tie_word_embeddings disagree");
    cuda_weight_layout layout;
    KITE_TRY(core_layout(core, &layout));
    *n = cuda_weight_layout_segment_count(&layout);
    for (int32_t i = 0; i < *n && i < capacity; i++) {
        uint64_t offset;
        cuda_weight_layout_segment(&layout, i, &segments[i], &offset);
    }
    return KITE_OK;
}

kite_status cuda_read_segment(backend *self, int32_t index, uint64_t offset, void *dst, size_t size) {
    cuda_core *core = &as_cuda(self)->core;
    cuda_weight_layout layout;
    KITE_TRY(core_layout(core, &layout));
    if (index < 0 || index >= cuda_weight_layout_segment_count(&layout))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: segment %d does not exist", (int)index);
    backend_segment segment;
    uint64_t start;
    cuda_weight_layout_segment(&layout, index, &segment, &start);
    if (offset > segment.size || size > segment.size - offset)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: segment %s: bytes [%llu, +%zu) past its %llu",
                         segment.name, (unsigned long long)offset, size, (unsigned long long)segment.size);
    CUDA_CHECK(cudaSetDevice(core->device));
    if (!core->export_staging) CUDA_CHECK(cudaMallocHost(&core->export_staging, EXPORT_STAGING_BYTES));
    const unsigned char *from = static_cast<const unsigned char *>(core->weight_bytes) + start + offset;
    unsigned char *to = static_cast<unsigned char *>(dst);
    for (size_t done = 0; done < size; done += EXPORT_STAGING_BYTES) {
        const size_t piece = size - done < EXPORT_STAGING_BYTES ? size - done : EXPORT_STAGING_BYTES;
        CUDA_CHECK(cudaMemcpyAsync(core->export_staging, from + done, piece, cudaMemcpyDeviceToHost, core->stream));
        CUDA_CHECK(cudaStreamSynchronize(core->stream));
        memcpy(to + done, core->export_staging, piece);
    }
    /* The cache writer reads the segments in order: after the last byte the staging has no further use. */
    if (index == cuda_weight_layout_segment_count(&layout) - 1 && offset + size == segment.size) {
        CUDA_CHECK(cudaFreeHost(core->export_staging));
        core->export_staging = NULL;
    }
    return KITE_OK;
}

/* The two staging buffers of an import and the event recorded after each one's upload. */
struct import_staging {
    void *buffer[2];
    cudaEvent_t uploaded[2];
    bool pending[2]; /* an upload from the buffer was enqueued and may not have finished */
};

/* Reads every segment of source into the allocation: piece k of the import is read into buffer k % 2 once that
 * buffer's previous upload finished, then uploaded asynchronously while piece k + 1 is read. */
kite_status import_segments(cuda_core *core, const backend_segment_source *source, const cuda_weight_layout *layout,
                            import_staging *staging, uint64_t piece_bytes) {
    unsigned char *base = static_cast<unsigned char *>(core->weight_bytes);
    int next = 0;
    for (int32_t i = 0; i < cuda_weight_layout_segment_count(layout); i++) {
        backend_segment segment;
        uint64_t start;
        cuda_weight_layout_segment(layout, i, &segment, &start);
        int32_t index;
        KITE_TRY(backend_segment_find(source, segment.name, segment.size, &index));
        for (uint64_t at = 0; at < segment.size; at += piece_bytes) {
            const size_t piece = (size_t)(segment.size - at < piece_bytes ? segment.size - at : piece_bytes);
            if (staging->pending[next]) {
                KITE_TRY(cuda_status(cudaEventSynchronize(staging->uploaded[next]), "cudaEventSynchronize(import)"));
                staging->pending[next] = false;
            }
            KITE_TRY(source->read(source, index, at, staging->buffer[next], piece));
            KITE_TRY(cuda_status(
                cudaMemcpyAsync(base + start + at, staging->buffer[next], piece, cudaMemcpyHostToDevice, core->stream),
                "cudaMemcpyAsync(import)"));
            KITE_TRY(cuda_status(cudaEventRecord(staging->uploaded[next], core->stream), "cudaEventRecord(import)"));
            staging->pending[next] = true;
            next ^= 1;
        }
    }
    return KITE_OK;
}

} // namespace

const backend_segment_ops cuda_segment_ops = {cuda_list_segments, cuda_read_segment};

kite_status fill_weights(cuda_core *core, const backend_segment_source *source) {
    KITE_TRY(place_weights(core, core->config.tie_word_embeddings));
    cuda_weight_layout layout;
    KITE_TRY(core_layout(core, &layout));
    /* Whole chunks per read (backend_segment_source): the largest multiple of chunk_bytes up to the target, at
     * least one chunk (cuda_weight_layout_check_source bounds it to 1 GiB). */
    const uint64_t chunk = source->chunk_bytes;
    if (chunk == 0 || chunk > CUDA_WEIGHT_SEGMENT_MAX_BYTES)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "the entry's chunks of %llu bytes are not 1 byte to 1 GiB",
                         (unsigned long long)chunk);
    const uint64_t piece_bytes =
        chunk * (IMPORT_PIECE_TARGET_BYTES / chunk > 0 ? IMPORT_PIECE_TARGET_BYTES / chunk : 1);

    import_staging staging = {};
    kite_status status = KITE_OK;
    for (int k = 0; k < 2 && status == KITE_OK; k++) {
        status = cuda_status(cudaMallocHost(&staging.buffer[k], (size_t)piece_bytes), "cudaMallocHost(import staging)");
        if (status == KITE_OK)
            status = cuda_status(cudaEventCreateWithFlags(&staging.uploaded[k], cudaEventDisableTiming),
                                 "cudaEventCreate(import)");
    }
    if (status == KITE_OK) status = import_segments(core, source, &layout, &staging, piece_bytes);
    /* The uploads still in flight read the staging buffers: they finish before the buffers go, on failure too. */
    const kite_status drained = cuda_status(cudaStreamSynchronize(core->stream), "cudaStreamSynchronize(import)");
    if (status == KITE_OK) status = drained;
    for (int k = 0; k < 2; k++) {
        /* Releases after the stream drained: nothing is left that a failure could lose. */
        if (staging.uploaded[k]) (void)cudaEventDestroy(staging.uploaded[k]);
        if (staging.buffer[k]) (void)cudaFreeHost(staging.buffer[k]);
    }
    return status;
}

/* The CUDA backend: weights on the device (bf16 matrices, fp32 norm vectors), the paged bf16 KV cache, and three
 * paths behind backend_ops.forward, composed from the kernels of kernels/ (cuda_forward picks one per step):
 * - single-stream decode (one sequence, one token, logits wanted): decode_path.cu;
 * - batched decode (2..BATCH_MAX sequences, one token each, all wanting logits): batch_path.cu;
 * - prefill (any other step batch: prefill chunks, mixed steps): prefill_path.cu.
 * Each path owns its state (cuda_backend.cuh: the backend's members) and returns the rows it kept (kept_rows), which
 * the readers of cuda_read_results.cu take. This file creates and destroys the backend, reserves the KV cache,
 * checks and dispatches each step and holds backend_ops and the setters of cuda_backend_internal.h.
 */
#include "backend/cuda/cuda_backend.cuh"
#include "backend/cuda/kernels/decode_attention.cuh" /* decode_group_size */

#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_backend_internal.h"
#include "backend/cuda_weight_layout.h"
#include "util/options.h"

namespace {

/* ---- tuning constants (measured on the H200, docs/cuda.md) ------------------------------------------ */

/* Batched buckets up to this many rows run through gemm_rows: 16 rows run faster through cuBLASLt. */
constexpr int32_t ROWS_MAX = 8;
/* With --weights fp8, up to this many rows (gemm_rows' limit): the W8A16 kernels read each code once, where the route
 * beyond dequantizes every layer into a bf16 scratch before cuBLASLt (a pass writing and re-reading 2 bytes per
 * weight). Predicted, not yet measured against that route at 16 and 32 rows. */
constexpr int32_t FP8_ROWS_MAX = 32;
/* Batched buckets up to this many rows take the bulk-fed cluster attention: per step against split-K B=16 -7.3%,
 * B=32 -5.5%, B=8 even; B=64 does not fit. */
constexpr int32_t BATCH_BULK_MAX_ROWS = 32;
/* The batched lm_head through gemm_rows up to this many rows: B=16 -2.3% per step against cuBLASLt; at 32 rows,
 * normalising fp32 rows per block, gemm_rows was 1-2% slower. */
constexpr int32_t BATCH_LM_HEAD_ROWS_MAX = 16;
/* o_proj and down of the cuBLASLt buckets in this many k slices: per step against cuBLASLt's products and separate
 * norms B=16 -8.5%, B=32 -7.2%, B=64 -6.3%, B=128 -5.0%, B=256 -0.8%; 2 and 8 slices were slower at B=16-128. */
constexpr int BATCH_SPLIT = 4;
/* ... in every cuBLASLt bucket (each one measured faster split). */
constexpr int32_t BATCH_SPLIT_MAX_ROWS = BATCH_MAX;
/* Single-stream contexts up to this many positions take the bulk-fed cluster attention, longer ones split-K: the
 * split-K kernel is the faster one from 2,048 (0.6B: 0.7275 vs 0.7828 ms per step at 2,048, 0.7849 vs 0.8855 at
 * 4,096), at 1,024 the two are equal for 0.6B, and at 256 split-K costs the 1.7B and 4B shapes 2.4% and 2.9%. */
constexpr int32_t BULK_MAX_CONTEXT = 1024;

/* ---- backend_ops ------------------------------------------------------------------------------------ */

void free_all(cuda_backend *b) {
    cuda_core *core = &b->core;
    if (core->stream) cudaStreamSynchronize(core->stream);
    decode_free(&b->decode);
    batch_free(&b->batch);
    prefill_free(&b->prefill);
    results_free(&b->results);
    cuda_gemm_destroy(core->gemm);
    cudaFree(core->weight_bytes);
    cudaFree(core->fp8_scratch);
    cudaFree(core->fp8_nonfinite);
    fp8_prefetch_free(core);
    free(core->layers);
    cudaFree(core->rope_cos);
    cudaFree(core->rope_sin);
    cudaFree(core->kv_cache);
    cudaFreeHost(core->export_staging);
    if (core->stream) cudaStreamDestroy(core->stream);
    free(b);
}

void cuda_destroy(backend *self) {
    if (self) free_all(as_cuda(self));
}

kite_status cuda_kv_reserve(backend *self, int32_t n_blocks, int32_t block_size) {
    cuda_backend *b = as_cuda(self);
    cuda_core *core = &b->core;
    const qwen3_config *c = &core->config;
    if (n_blocks <= 0 || block_size <= 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: kv_reserve(%d blocks, block size %d)", n_blocks, block_size);
    const cuda_kv_layer shape = {NULL, block_size, c->n_kv_heads, c->head_dim, 0, core->kv_dtype};
    const size_t block_bytes = cuda_kv_block_bytes(shape);
    /* The decode kernels read 16-byte pieces from every block: an fp8 block (rows of head_dim + 4 bytes) must keep
     * that alignment. */
    if (block_bytes % 16 != 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "cuda backend: a KV block of %d positions x %d kv heads is %zu bytes, not a multiple of 16 "
                         "(use an even block size with --kv-cache-dtype fp8)",
                         block_size, c->n_kv_heads, block_bytes);
    CUDA_CHECK(cudaSetDevice(core->device));
    CUDA_CHECK(cudaStreamSynchronize(core->stream));
    KITE_TRY(decode_destroy_graphs(&b->decode));
    KITE_TRY(batch_destroy_graphs(&b->batch));
    if (core->kv_cache) CUDA_CHECK(cudaFree(core->kv_cache));
    core->kv_cache = NULL;
    core->kv_blocks = core->kv_block_size = 0;
    /* One block more than asked: the scratch block where the batched path's dummy rows write. */
    const size_t layer_bytes = ((size_t)n_blocks + 1) * block_bytes;
    const size_t bytes = layer_bytes * (size_t)c->n_layers;
    const cudaError_t e = cudaMalloc(reinterpret_cast<void **>(&core->kv_cache), bytes);
    if (e != cudaSuccess) {
        core->kv_cache = NULL;
        cudaGetLastError();
        return kite_fail(e == cudaErrorMemoryAllocation ? KITE_ERROR_OUT_OF_MEMORY : KITE_ERROR_BACKEND,
                         "cuda backend: KV cache of %d blocks x %d positions (%zu bytes): cudaMalloc failed: %s",
                         n_blocks, block_size, bytes, cudaGetErrorName(e));
    }
    /* Attention reads whole 128-position pieces of a block and masks the positions past the context: those must
     * hold finite values (zeros until written; an fp8 row of zero codes and scale 0 is zeros). */
    CUDA_CHECK(cudaMemsetAsync(core->kv_cache, 0, bytes, core->stream));
    CUDA_CHECK(cudaStreamSynchronize(core->stream));
    KITE_TRY(decode_reserve_step(&b->decode, n_blocks));
    core->kv_layer_bytes = layer_bytes;
    core->kv_blocks = n_blocks;
    core->kv_block_size = block_size;
    return KITE_OK;
}

kite_status validate_batch(const cuda_backend *b, const step_batch *batch) {
    const cuda_core *core = &b->core;
    const qwen3_config *c = &core->config;
    if (!core->kv_cache) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: forward before kv_reserve");
    if (!batch || batch->n_seqs <= 0 || batch->n_tokens <= 0 || (!batch->token_ids && !batch->tokens_from_argmax) ||
        !batch->seq_token_start || !batch->seq_context_len || !batch->block_tables || !batch->seq_wants_logits)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: empty or incomplete step batch");
    if (batch->tokens_from_argmax) {
        bool all_want = batch->n_tokens == batch->n_seqs;
        for (int32_t s = 0; s < batch->n_seqs; s++) all_want &= batch->seq_wants_logits[s] != 0;
        if (!all_want || b->kept.n_rows != batch->n_seqs)
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                             "cuda backend: tokens from the argmax need one token and a logits row per sequence (%d "
                             "sequences, %d tokens) and as many kept rows (%d)",
                             batch->n_seqs, batch->n_tokens, b->kept.n_rows);
    }
    if (batch->seq_token_start[0] != 0 || batch->seq_token_start[batch->n_seqs] != batch->n_tokens)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: seq_token_start does not span %d tokens", batch->n_tokens);
    for (int32_t t = 0; t < batch->n_tokens && !batch->tokens_from_argmax; t++)
        if (batch->token_ids[t] < 0 || batch->token_ids[t] >= c->vocab_size)
            return kite_fail(KITE_ERROR_INVALID_INPUT, "cuda backend: token id %d at %d is outside [0, %d)",
                             batch->token_ids[t], t, c->vocab_size);
    for (int32_t s = 0; s < batch->n_seqs; s++) {
        const int32_t n_new = batch->seq_token_start[s + 1] - batch->seq_token_start[s];
        const int32_t context = batch->seq_context_len[s];
        if (n_new <= 0 || context < n_new)
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: sequence %d has %d new tokens and context %d", s,
                             n_new, context);
        if (context > core->rope_positions || (int64_t)context > (int64_t)core->kv_blocks * core->kv_block_size)
            return kite_fail(KITE_ERROR_CAPACITY, "cuda backend: sequence %d context %d exceeds %d positions", s, context,
                             core->rope_positions);
        const int32_t n_blocks = KITE_CEIL_DIV(context, core->kv_block_size);
        for (int32_t i = 0; i < n_blocks; i++)
            if (batch->block_tables[s][i] < 0 || batch->block_tables[s][i] >= core->kv_blocks)
                return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: sequence %d block %d is %d, outside [0, %d)",
                                 s, i, batch->block_tables[s][i], core->kv_blocks);
    }
    return KITE_OK;
}

/* A step to the path that serves it. A failed step keeps no rows. */
kite_status cuda_forward(backend *self, const step_batch *batch) {
    cuda_backend *b = as_cuda(self);
    KITE_TRY(validate_batch(b, batch));
    /* tokens_from_argmax: the kept rows' argmax, before this step replaces them */
    step_tokens tokens = {false, NULL, KEPT_NONE};
    if (batch->tokens_from_argmax) {
        tokens.on_device = true;
        tokens.written_by = b->kept.path;
        KITE_TRY(kept_argmax_device(&b->core, &b->results, b->kept, batch->n_seqs, &tokens.ids));
    }
    b->kept = kept_none();
    kept_rows kept = kept_none();
    if (batch->n_seqs == 1 && batch->n_tokens == 1 && batch->seq_wants_logits[0]) {
        nvtx_scope range("kite decode step");
        KITE_TRY(forward_decode(&b->core, &b->decode, batch, tokens, &kept));
    } else {
        bool batched = b->batch.enabled && batch->n_seqs > 1 && batch->n_seqs <= BATCH_MAX &&
                       batch->n_tokens == batch->n_seqs; /* one new token each (validated: at least one each) */
        for (int32_t s = 0; s < batch->n_seqs && batched; s++) batched = batch->seq_wants_logits[s] != 0;
        if (batched) {
            nvtx_scope range("kite batched decode step");
            KITE_TRY(forward_batch(&b->core, &b->batch, batch, tokens, &kept));
        } else {
            nvtx_scope range("kite forward (prefill or mixed)");
            KITE_TRY(forward_prefill(&b->core, &b->prefill, batch, tokens, &kept));
        }
    }
    b->kept = kept;
    return KITE_OK;
}

kite_status cuda_read_logits(backend *self, float *out, int32_t n_rows) {
    cuda_backend *b = as_cuda(self);
    return read_logits(&b->core, b->kept, out, n_rows);
}

kite_status cuda_read_top(backend *self, int32_t n_rows, int32_t k, float *top_logits, int32_t *top_ids,
                          backend_row_top *stats) {
    cuda_backend *b = as_cuda(self);
    return read_top(&b->core, &b->results, b->kept, n_rows, k, top_logits, top_ids, stats);
}

kite_status cuda_argmax(backend *self, int32_t *out_ids, int32_t n_rows) {
    cuda_backend *b = as_cuda(self);
    return read_argmax(&b->core, &b->results, b->kept, out_ids, n_rows);
}

kite_status cuda_argmax_begin(backend *self, int32_t n_rows) {
    cuda_backend *b = as_cuda(self);
    return argmax_begin(&b->core, &b->results, b->kept, n_rows);
}

kite_status cuda_argmax_end(backend *self, int32_t *out_ids, int32_t n_rows) {
    return argmax_end(&as_cuda(self)->results, out_ids, n_rows);
}

kite_status cuda_memory_info(backend *self, size_t *free_bytes, size_t *total_bytes) {
    cuda_backend *b = as_cuda(self);
    CUDA_CHECK(cudaSetDevice(b->core.device));
    CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
    return KITE_OK;
}

const char *cuda_device_name(backend *self) { return as_cuda(self)->core.device_name; }

/* E.g. "single stream: graph+pdl; attention: bulk-fed cluster of 8 up to 1024, split-K beyond; greedy lm_head:
 * int8 screen, bf16 candidates; batched: gemm_rows up to 8 rows (lm_head up to 16), cuBLASLt beyond (o_proj/down in
 * 4 k slices up to 256 rows); attention: bulk-fed clusters up to 32 rows, split-K beyond". Written when asked, from
 * the settings in effect then (the switches at creation, the tests' and bench's setters since). */
const char *cuda_decode_path(backend *self) {
    cuda_backend *b = as_cuda(self);
    const cuda_core *core = &b->core;
    const decode_state *d = &b->decode;
    const batch_state *bp = &b->batch;
    char single[320], batched[288];
    char attention[224] = "";
    size_t at = 0;
    if (d->attention_bulk > 0 && d->bulk_max_context > 0)
        at += (size_t)snprintf(attention + at, sizeof attention - at, "bulk-fed cluster of %d up to %d, ",
                               d->attention_bulk, (int)d->bulk_max_context);
    if (at < sizeof attention)
        snprintf(attention + at, sizeof attention - at, "%s",
                 core->kv_dtype == KITE_KV_CACHE_FP8 ? "split-K over the fp8 KV cache" : "split-K beyond");
    snprintf(single, sizeof single, "%s; attention: %s; greedy lm_head: %s",
             core->use_graph ? (core->use_pdl ? "graph+pdl" : "graph") : (core->use_pdl ? "pdl, no graph" : "no graph"),
             attention, d->lm_head_screen ? "int8 screen, bf16 candidates" : "bf16");
    if (bp->enabled)
        snprintf(batched, sizeof batched,
                 "gemm_rows up to %d rows (lm_head up to %d), cuBLASLt beyond (o_proj/down in %d k slices up to %d "
                 "rows); attention: bulk-fed clusters up to %d rows, split-K beyond",
                 core->weights == KITE_WEIGHTS_FP8 ? bp->fp8_rows_max : bp->rows_max, bp->lm_head_rows_max, bp->split,
                 bp->split > 1 ? bp->split_max_rows : 0, bp->bulk_max_rows);
    else
        snprintf(batched, sizeof batched, "off (prefill path)");
    snprintf(b->decode_path, sizeof b->decode_path, "single stream: %s; batched: %s", single, batched);
    return b->decode_path;
}

const backend_ops cuda_ops = {
    "cuda", cuda_destroy, cuda_kv_reserve, cuda_forward, cuda_read_logits, cuda_argmax, cuda_memory_info,
    cuda_device_name, cuda_decode_path, cuda_read_top, cuda_argmax_begin, cuda_argmax_end,
};

kite_status check_device(int device, char *reason, size_t capacity) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        return kite_fail(KITE_ERROR_UNSUPPORTED, "no CUDA GPU is usable here (%s)",
                         e != cudaSuccess ? cudaGetErrorString(e) : "no device found");
    }
    if (device < 0 || device >= count)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "CUDA device %d does not exist (%d found)", device, count);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    if (prop.major != 9 || prop.minor != 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "GPU %d (%s) is compute capability %d.%d; this build of kite has CUDA code for sm_90a "
                         "(Hopper: H100, H200) only",
                         device, prop.name, prop.major, prop.minor);
    (void)reason;
    (void)capacity;
    return KITE_OK;
}

/* What creation checks before it touches the device's memory: the weights mode, the device, and the shapes the
 * kernels implement. */
kite_status check_create(const qwen3_config *c, const backend_params *params) {
    const kite_weights weights = params ? params->weights : KITE_WEIGHTS_BF16;
    if (weights != KITE_WEIGHTS_BF16 && weights != KITE_WEIGHTS_FP8)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: weights mode %d is not bf16 or fp8", (int)weights);
    /* The fp8 decode GEMV reads 16 codes per load: every linear layer's columns a multiple of 16. */
    if (weights == KITE_WEIGHTS_FP8 && (c->hidden_size % 16 != 0 || c->intermediate_size % 16 != 0))
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "cuda backend: --weights fp8 needs hidden_size (%d) and intermediate_size (%d) to be "
                         "multiples of 16",
                         c->hidden_size, c->intermediate_size);
    const kite_kv_cache_dtype kv_dtype = params ? params->kv_cache_dtype : KITE_KV_CACHE_BF16;
    if (kv_dtype != KITE_KV_CACHE_BF16 && kv_dtype != KITE_KV_CACHE_FP8)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: KV cache dtype %d is not bf16 or fp8", (int)kv_dtype);
    KITE_TRY(check_device(params ? params->device : 0, NULL, 0));
    if (c->head_dim != 128)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda backend: head_dim %d (only 128 is implemented)", c->head_dim);
    if (c->hidden_size % 8 != 0 || c->intermediate_size % 8 != 0 || c->n_kv_heads <= 0 ||
        c->n_heads % c->n_kv_heads != 0 || c->vocab_size <= 0 || c->n_layers <= 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda backend: unsupported shape (hidden %d, intermediate %d, heads %d/%d)",
                         c->hidden_size, c->intermediate_size, c->n_heads, c->n_kv_heads);
    return KITE_OK;
}

#define STEP(expr)                                                                                       \
    do {                                                                                                 \
        if (status == KITE_OK) status = (expr);                                                          \
    } while (0)

/* The backend before its weights: the switches, the device's stream, events and mapped host words, the cuBLASLt
 * handle. On failure it is freed and *out stays NULL. */
kite_status create_without_weights(const qwen3_config *config, int device, const runtime_options *options,
                                   cuda_backend **out) {
    *out = NULL;
    const qwen3_config *c = config;
    CUDA_CHECK(cudaSetDevice(device));
    cuda_backend *b = static_cast<cuda_backend *>(calloc(1, sizeof(cuda_backend)));
    if (!b) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cuda backend: out of host memory");
    cuda_core *core = &b->core;
    decode_state *d = &b->decode;
    batch_state *bp = &b->batch;
    core->config = *config;
    b->base.ops = &cuda_ops;
    b->base.config = &core->config;
    b->base.segments = &cuda_segment_ops;
    b->kept = kept_none();
    core->device = device;
    core->use_graph = options->cuda_graph != 0;
    core->use_pdl = options->cuda_pdl != 0;
    bp->enabled = options->cuda_batch != 0;
    bp->rows_max = ROWS_MAX;
    bp->fp8_rows_max = FP8_ROWS_MAX;
    bp->bulk_max_rows = BATCH_BULK_MAX_ROWS;
    bp->lm_head_rows_max = BATCH_LM_HEAD_ROWS_MAX;
    bp->split = batch_split_fits(c, BATCH_SPLIT) ? BATCH_SPLIT : 0; /* a split that does not fit is not used */
    bp->split_max_rows = BATCH_SPLIT_MAX_ROWS;
    d->bulk_max_context = BULK_MAX_CONTEXT;

    kite_status status = KITE_OK;
    STEP(cuda_status(cudaDeviceGetAttribute(&core->sm_count, cudaDevAttrMultiProcessorCount, device),
                     "cudaDeviceGetAttribute"));
    cudaDeviceProp prop;
    STEP(cuda_status(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
    if (status == KITE_OK) snprintf(core->device_name, sizeof core->device_name, "%s", prop.name);
    STEP(cuda_status(cudaStreamCreateWithFlags(&core->stream, cudaStreamNonBlocking), "cudaStreamCreate"));
    STEP(cuda_status(cudaEventCreateWithFlags(&b->prefill.meta_copied, cudaEventDisableTiming), "cudaEventCreate"));
    STEP(cuda_status(cudaEventCreateWithFlags(&d->step_copied, cudaEventDisableTiming), "cudaEventCreate"));
    STEP(cuda_status(cudaEventCreateWithFlags(&bp->step_copied, cudaEventDisableTiming), "cudaEventCreate"));
    for (int i = 0; i < BACKEND_ARGMAX_PENDING; i++)
        STEP(cuda_status(cudaEventCreateWithFlags(&b->results.begun_copied[i], cudaEventDisableTiming),
                         "cudaEventCreate"));
    STEP(cuda_status(
        cudaHostAlloc(reinterpret_cast<void **>(&d->publish_host), 2 * sizeof(int32_t), cudaHostAllocMapped),
        "cudaHostAlloc"));
    STEP(cuda_status(cudaHostGetDevicePointer(reinterpret_cast<void **>(&d->publish_device), d->publish_host, 0),
                     "cudaHostGetDevicePointer"));
    STEP(cuda_status(cudaHostAlloc(reinterpret_cast<void **>(&bp->publish_host), 2 * BATCH_MAX * sizeof(int32_t),
                                   cudaHostAllocMapped),
                     "cudaHostAlloc"));
    STEP(cuda_status(cudaHostGetDevicePointer(reinterpret_cast<void **>(&bp->publish_device), bp->publish_host, 0),
                     "cudaHostGetDevicePointer"));
    STEP(cuda_gemm_create(&core->gemm));
    if (status != KITE_OK) {
        free_all(b);
        return status;
    }
    *out = b;
    return KITE_OK;
}

/* What needs the weights in place: the RoPE table, the decode buffers, the lm_head's int8 screen (built from the
 * lm_head), the attention clusters; then the device synchronised, so that an asynchronous failure surfaces here. */
kite_status finish_create(cuda_backend *b, const runtime_options *options) {
    cuda_core *core = &b->core;
    decode_state *d = &b->decode;
    batch_state *bp = &b->batch;
    const qwen3_config *c = &core->config;
    kite_status status = KITE_OK;
    STEP(upload_rope(core));
    /* The weights and the RoPE table went up by cudaMemcpy on the legacy stream, which from pageable memory returns
     * once the bytes are staged, before their DMA ends; the core's stream is non-blocking, so nothing orders its
     * kernels (the lm_head screen's build below, the first forward) after those copies but this synchronisation. */
    STEP(cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize(after the weights' upload)"));

    /* Decode buffers: fixed for the life of the backend, so the captured graphs stay valid. */
    const int group_heads = qwen3_group_heads(c);
    core->head_groups = group_heads / decode_group_size(group_heads);
    /* One wave of split-K blocks, by the kernel's occupancy: 4 per SM at GROUP 2 (128 registers), 5 at GROUP 1 (91),
     * 2 at GROUP 4 (209; Qwen3-4B at depth 16,384: 3.74 ms per token with 33 splits against 3.92 with 66). */
    STEP(cuda_attention_decode_blocks_per_sm(c->n_heads, c->n_kv_heads, core->kv_dtype, &core->split_blocks_per_sm));
    d->n_splits = attention_splits(core, 1); /* at least 1 */
    STEP(decode_alloc_buffers(core, d));
    /* The lm_head's int8 screen for greedy single-stream decode (lm_head_screen.cu): half the lm_head's bytes of
     * device memory more, to read half its bytes per greedy step. Off with KITE_CUDA_LM_HEAD_SCREEN=0; left off
     * (decode then reads the bf16 lm_head whole) where the shape does not suit its kernels or the device has no
     * room for it. */
    if (status == KITE_OK && options->cuda_lm_head_screen && cuda_lm_head_screen_fits(c->vocab_size, c->hidden_size)) {
        if (cudaMalloc(&d->lm_head_screen, cuda_lm_head_screen_bytes(c->vocab_size, c->hidden_size)) == cudaSuccess) {
            STEP(cuda_lm_head_screen_build(core->lm_head, c->vocab_size, c->hidden_size, d->lm_head_screen,
                                           core->stream));
        } else {
            (void)cudaGetLastError(); /* out of memory: not sticky; clear it */
            d->lm_head_screen = NULL;
        }
    }
    /* The bulk-fed cluster kernels read bf16 caches only: with an fp8 cache their sizes are 0 and every decode
     * step takes the split-K kernel. */
    if (status == KITE_OK && options->cuda_attention_cluster) {
        const cuda_kv_layer shape = {NULL, 16, c->n_kv_heads, c->head_dim, 0, core->kv_dtype};
        d->attention_bulk = cuda_attention_decode_bulk_size(c->n_heads, shape);
        for (int i = 0; i < N_BUCKETS; i++)
            bp->bulk_cluster[i] = cuda_attention_decode_bulk_rows_size(c->n_heads, shape, BUCKETS[i]);
    }
    STEP(cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize(after upload)"));
    return status;
}

#undef STEP

/* A backend whose weights `place_and_fill` puts on the device (from a checkpoint, or from a weight cache entry),
 * everything else made alike; on any failure everything is freed and *out stays NULL. */
template <typename PlaceAndFill>
kite_status create_with(const qwen3_config *config, const backend_params *params, PlaceAndFill place_and_fill,
                        backend **out) {
    runtime_options options;
    KITE_TRY(options_read(&options));
    cuda_backend *b = NULL;
    KITE_TRY(create_without_weights(config, params ? params->device : 0, &options, &b));
    b->core.weights = params ? params->weights : KITE_WEIGHTS_BF16;
    b->core.kv_dtype = params ? params->kv_cache_dtype : KITE_KV_CACHE_BF16;
    b->base.kv_cache_dtype = b->core.kv_dtype; /* the engine sizes its pool by it (backend_kv_bytes_per_position) */
    kite_status status = place_and_fill(&b->core);
    if (status == KITE_OK) status = finish_create(b, &options);
    if (status != KITE_OK) {
        free_all(b);
        return status;
    }
    *out = &b->base;
    return KITE_OK;
}

} // namespace

extern "C" int cuda_backend_available(char *reason, size_t reason_capacity) {
    if (check_device(0, reason, reason_capacity) != KITE_OK) {
        if (reason && reason_capacity) snprintf(reason, reason_capacity, "%s", kite_last_error());
        return 0;
    }
    return 1;
}

extern "C" kite_status cuda_backend_create(const qwen3_config *config, const qwen3_weights *weights,
                                           const backend_params *params, backend **out) {
    *out = NULL;
    if (!config || !weights)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: no config or weights");
    KITE_TRY(check_create(config, params));
    return create_with(config, params, [&](cuda_core *core) { return upload_weights(core, weights); }, out);
}

extern "C" kite_status cuda_backend_create_from_segments(const qwen3_config *config,
                                                         const backend_segment_source *source,
                                                         const backend_params *params, backend **out) {
    if (!out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_backend_create_from_segments: out is NULL");
    *out = NULL;
    if (!config || !source)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_backend_create_from_segments: config or source is NULL");
    KITE_TRY(check_create(config, params));
    /* The entry is checked against this config's layout before the device holds anything of it. */
    cuda_weight_layout layout;
    KITE_TRY(cuda_weight_layout_make(config, config->tie_word_embeddings, params ? params->weights : KITE_WEIGHTS_BF16,
                                     &layout));
    KITE_TRY(cuda_weight_layout_check_source(&layout, source));
    return create_with(config, params, [&](cuda_core *core) { return fill_weights(core, source); }, out);
}

extern "C" kite_status cuda_backend_set_decode_options(backend *self, int use_graph, int use_pdl) {
    cuda_backend *b = as_cuda(self);
    CUDA_CHECK(cudaStreamSynchronize(b->core.stream));
    KITE_TRY(decode_destroy_graphs(&b->decode));
    KITE_TRY(batch_destroy_graphs(&b->batch));
    b->core.use_graph = use_graph != 0;
    b->core.use_pdl = use_pdl != 0;
    return KITE_OK;
}

extern "C" kite_status cuda_backend_set_bulk_max_context(backend *self, int32_t max_context) {
    as_cuda(self)->decode.bulk_max_context = max_context; /* the graphs stay valid: forward picks one per step */
    return KITE_OK;
}

extern "C" int32_t cuda_backend_bulk_max_context(backend *self) { return as_cuda(self)->decode.bulk_max_context; }

extern "C" int cuda_backend_attention_bulk(backend *self) { return as_cuda(self)->decode.attention_bulk; }

extern "C" kite_status cuda_backend_set_batch_bulk_max_rows(backend *self, int32_t max_rows) {
    cuda_backend *b = as_cuda(self);
    CUDA_CHECK(cudaStreamSynchronize(b->core.stream));
    KITE_TRY(batch_destroy_graphs(&b->batch)); /* each bucket's graph holds its attention kernel */
    b->batch.bulk_max_rows = max_rows;
    return KITE_OK;
}

extern "C" kite_status cuda_backend_set_batch_fp8_rows_max(backend *self, int32_t max_rows) {
    cuda_backend *b = as_cuda(self);
    CUDA_CHECK(cudaStreamSynchronize(b->core.stream));
    KITE_TRY(batch_destroy_graphs(&b->batch)); /* each bucket's graph holds its products */
    b->batch.fp8_rows_max = max_rows;
    return KITE_OK;
}

extern "C" kite_status cuda_backend_set_batch_split(backend *self, int slices, int32_t max_rows) {
    cuda_backend *b = as_cuda(self);
    if (slices > 1 && !batch_split_fits(&b->core.config, slices))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: %d slices do not divide o_proj and down", slices);
    if (b->kept.path == KEPT_BATCH) b->kept = kept_none(); /* its rows lived in the buffers freed next */
    KITE_TRY(batch_release(&b->core, &b->batch)); /* ensure_batch allocates again, with the partials */
    b->batch.split = slices > 1 ? slices : 0;
    b->batch.split_max_rows = max_rows;
    return KITE_OK;
}

extern "C" const char *cuda_backend_cluster_report(backend *self, char *buffer, size_t capacity) {
    const cuda_backend *b = as_cuda(self);
    const qwen3_config *c = &b->core.config;
    const cuda_kv_layer shape = {NULL, 16, c->n_kv_heads, c->head_dim, 0, b->core.kv_dtype};
    const int needed = c->n_kv_heads * b->core.head_groups;
    size_t at = (size_t)snprintf(buffer, capacity, "cluster capacity (%d clusters needed; size: clusters, blocks per SM):",
                                 needed);
    for (int batched = 0; batched < 2 && at < capacity; batched++) {
        at += (size_t)snprintf(buffer + at, capacity - at, " %s", batched ? "bulk batched" : "bulk");
        for (int size = 8; size <= 16 && at < capacity; size *= 2) {
            int clusters = 0, per_sm = 0;
            cuda_attention_decode_bulk_capacity(c->n_heads, shape, size, batched, &clusters, &per_sm);
            at += (size_t)snprintf(buffer + at, capacity - at, " %d: %d, %d;", size, clusters, per_sm);
        }
    }
    return buffer;
}

extern "C" int32_t cuda_backend_batch_bulk_max_rows(backend *self) { return as_cuda(self)->batch.bulk_max_rows; }

extern "C" int cuda_backend_batch_bulk_cluster(backend *self, int32_t rows) {
    return batch_bulk_cluster(&as_cuda(self)->batch, rows);
}

extern "C" unsigned long long cuda_backend_step_copies(backend *self) { return as_cuda(self)->decode.step_copies; }

extern "C" kite_status cuda_backend_set_batched_decode(backend *self, int on) {
    cuda_backend *b = as_cuda(self);
    CUDA_CHECK(cudaStreamSynchronize(b->core.stream));
    b->batch.enabled = on != 0;
    return KITE_OK;
}

extern "C" kite_status cuda_backend_synchronize(backend *self) {
    CUDA_CHECK(cudaStreamSynchronize(as_cuda(self)->core.stream));
    return KITE_OK;
}

extern "C" size_t cuda_backend_kv_block_bytes(backend *self) {
    const cuda_core *core = &as_cuda(self)->core;
    return core->kv_cache ? cuda_kv_block_bytes(kv_layer(core, 0)) : 0;
}

extern "C" kite_status cuda_backend_read_kv_block(backend *self, int32_t layer, int32_t block, void *out, size_t bytes) {
    cuda_core *core = &as_cuda(self)->core;
    if (!core->kv_cache || layer < 0 || layer >= core->config.n_layers || block < 0 || block > core->kv_blocks ||
        bytes != cuda_backend_kv_block_bytes(self))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_backend_read_kv_block: layer %d block %d (%zu bytes)", layer,
                         block, bytes);
    const cuda_kv_layer kv = kv_layer(core, layer);
    CUDA_CHECK(cudaStreamSynchronize(core->stream));
    CUDA_CHECK(cudaMemcpy(out, static_cast<const unsigned char *>(kv.base) + (size_t)block * bytes, bytes,
                          cudaMemcpyDeviceToHost));
    return KITE_OK;
}

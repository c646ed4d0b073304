/* What the CUDA backend's paths share (C++, never included by host C code; the plain-C entry points for tests and
 * the bench are cuda_backend_internal.h): the core (device, stream, cuBLASLt handle, switches, weights, KV cache),
 * the rows a step keeps for the readers (kept_rows), where a step's tokens come from (step_tokens), and small
 * helpers (an NVTX range, buffers in one allocation, growing buffers, graph capture).
 *
 *   cuda_backend.cu       creation, destruction, kv_reserve, the dispatch of each step to a path, backend_ops and
 *                         the setters of cuda_backend_internal.h (cuda_backend.cuh: the backend, its members)
 *   cuda_weights.cu       weights and the RoPE table to the device (the core's)
 *   prefill_path.cu       any step batch: prefill chunks and mixed steps (prefill_path.cuh)
 *   decode_path.cu        single-stream decode: one sequence, one token (decode_path.cuh)
 *   batch_path.cu         batched decode: 2..BATCH_MAX sequences of one token each (batch_path.cuh)
 *   cuda_read_results.cu  the kept rows' logits, top candidates and argmax ids back to the host (read_results.cuh)
 * The kernels the paths compose are in kernels/ (kernels/cuda_ops.h is their index).
 */
#ifndef KITE_BACKEND_CUDA_CORE_CUH
#define KITE_BACKEND_CUDA_CORE_CUH

#include "backend/cuda/kernels/cuda_common.cuh"

#include <nvtx3/nvToolsExt.h>


/* A layer's weights. With --weights fp8 the bf16 matrices are NULL in core->layers and the codes and scales hold the
 * linear layers instead; the batched path dequantizes them into core->fp8_scratch (layer_for_gemm), the prefill path
 * one layer ahead into two scratches (fp8_prefetch.cu). */
struct cuda_layer {
    bf16 *qkv;     /* (qkv_dim, hidden): q_proj, k_proj, v_proj rows */
    bf16 *o;       /* (hidden, q_dim) */
    bf16 *gate_up; /* (2 intermediate, hidden): gate_proj rows then up_proj rows */
    bf16 *down;    /* (hidden, intermediate) */
    /* --weights fp8: E4M3 codes of the same shapes, and float32 block scales [ceil(rows / 128)][ceil(cols / 128)]
     * (cuda_weight_layout.h: a fused matrix's grid is its sources' grids one after another). */
    uint8_t *qkv_q, *o_q, *gate_up_q, *down_q;
    float *qkv_scale, *o_scale, *gate_up_scale, *down_scale;
    float *input_norm, *post_norm; /* (hidden) */
    float *q_norm, *k_norm;        /* (head_dim) */
};

/* Which of a layer's four linear products (each path's products name them so). */
enum cuda_linear { LINEAR_QKV, LINEAR_O, LINEAR_GATE_UP, LINEAR_DOWN };

inline const bf16 *cuda_linear_matrix(const cuda_layer *L, cuda_linear which) {
    return which == LINEAR_QKV ? L->qkv : which == LINEAR_O ? L->o : which == LINEAR_GATE_UP ? L->gate_up : L->down;
}
/* --weights fp8: the product's E4M3 codes and its float32 block scales. */
inline const uint8_t *cuda_linear_codes(const cuda_layer *L, cuda_linear which) {
    return which == LINEAR_QKV ? L->qkv_q : which == LINEAR_O ? L->o_q : which == LINEAR_GATE_UP ? L->gate_up_q : L->down_q;
}
inline const float *cuda_linear_scales(const cuda_layer *L, cuda_linear which) {
    return which == LINEAR_QKV       ? L->qkv_scale
           : which == LINEAR_O       ? L->o_scale
           : which == LINEAR_GATE_UP ? L->gate_up_scale
                                     : L->down_scale;
}

/* The prefill path's fp8 layers dequantized one layer ahead on a side stream (fp8_prefetch.cu): the second of two
 * scratches (the first is core->fp8_scratch) and the events that order them. */
struct fp8_prefetch_state {
    bf16 *second;
    cudaStream_t side;
    cudaEvent_t fork, ready[2], consumed[2];
};

/* The device, the weights and the KV cache: set up at creation (the cache by kv_reserve), read by every path. */
struct cuda_core {
    qwen3_config config;
    int device, sm_count;
    char device_name[256];
    cudaStream_t stream;
    cuda_gemm *gemm;
    bool use_graph, use_pdl; /* the decode paths: captured graphs, programmatic dependent launch */
    int head_groups;         /* blocks per kv head in decode attention (query heads per block: group_heads / this) */
    int split_blocks_per_sm; /* split-K decode attention blocks an SM holds (cuda_attention_decode_blocks_per_sm) */

    kite_weights weights;  /* how the linear layers are held: bf16, or fp8 codes with block scales */
    void *weight_bytes;    /* one allocation for every weight, laid out by cuda_weight_layout.h */
    /* --weights fp8: one layer's linear weights dequantized to bf16 (the batched and prefill paths' products), and
     * the flag a non-finite weight sets during quantization (device int); NULL otherwise. */
    bf16 *fp8_scratch;
    int *fp8_nonfinite;
    fp8_prefetch_state fp8_prefetch; /* --weights fp8 only */
    uint64_t weight_total; /* its bytes */
    /* Pinned staging of the weight cache's export (read_segment), made at its first call and freed after its last
     * byte: bounded, so a fill never needs a segment whole in host memory. */
    void *export_staging;
    bf16 *embed, *lm_head;
    float *final_norm;
    cuda_layer *layers;
    float *rope_cos, *rope_sin; /* (rope_positions, head_dim / 2) */
    int32_t rope_positions;

    /* kv_blocks + 1 blocks per layer (the last one the batched path's scratch block), each laid out for kv_dtype
     * (kernels/cuda_ops.h: bf16 rows, or fp8 codes then scales); kv_layer_bytes apart. */
    unsigned char *kv_cache;
    kite_kv_cache_dtype kv_dtype;
    int32_t kv_blocks, kv_block_size;
    size_t kv_layer_bytes;
};

/* A layer's view of the paged KV cache. */
inline cuda_kv_layer kv_layer(const cuda_core *core, int layer) {
    cuda_kv_layer kv;
    kv.base = core->kv_cache + (size_t)layer * core->kv_layer_bytes;
    kv.block_size = core->kv_block_size;
    kv.n_kv_heads = core->config.n_kv_heads;
    kv.head_dim = core->config.head_dim;
    kv.n_blocks = core->kv_blocks + 1; /* with the scratch block */
    kv.dtype = core->kv_dtype;
    return kv;
}

/* Splits per (sequence, kv head, head group) of the split-K decode attention for `rows` sequences: as many as fill
 * the device once (split_blocks_per_sm blocks per SM). Single-stream decode uses rows = 1. */
inline int attention_splits(const cuda_core *core, int32_t rows) {
    const int blocks = core->split_blocks_per_sm * (core->sm_count ? core->sm_count : 132);
    const int splits = blocks / (core->config.n_kv_heads * core->head_groups * rows);
    return splits < 1 ? 1 : splits;
}

/* The path that produced a step's kept rows (the readers' source). */
enum kept_path { KEPT_NONE = 0, KEPT_PREFILL, KEPT_DECODE, KEPT_BATCH };

/* The rows a forward keeps for read_logits, read_top, argmax and argmax_begin: what each path returns and the
 * readers take. */
struct kept_rows {
    kept_path path;
    int32_t n_rows;
    const float *logits;               /* (n_rows, vocab) on the device; NULL: the step kept ids only (ids_only) */
    const int32_t *argmax_ids;         /* the rows' argmax on the device; NULL: computed from logits when asked */
    const volatile int32_t *published; /* the ids in mapped host memory, written by the step; NULL: none */
};

inline kept_rows kept_none() { return kept_rows{KEPT_NONE, 0, NULL, NULL, NULL}; }

/* Where a step's tokens come from: the host (step_batch.token_ids), or the previous step's argmax on the device
 * (step_batch.tokens_from_argmax): `ids`, written by `written_by` (a path reads its own ids in place). */
struct step_tokens {
    bool on_device;
    const int32_t *ids;
    kept_path written_by;
};

/* A named NVTX range over a scope of host code (what an Nsight Systems timeline shows above the kernels it
 * enqueued); header-only NVTX 3, a no-op unless a profiler is attached. */
struct nvtx_scope {
    explicit nvtx_scope(const char *name) { nvtxRangePushA(name); }
    ~nvtx_scope() { nvtxRangePop(); }
    nvtx_scope(const nvtx_scope &) = delete;
    nvtx_scope &operator=(const nvtx_scope &) = delete;
};

inline size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* A CUDA call's result as a status, for code that must clean up before it returns (CUDA_CHECK returns at once). */
inline kite_status cuda_status(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return KITE_OK;
    return kite_fail(KITE_ERROR_BACKEND, "cuda: %s failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

/* Several buffers kept in one device allocation (the decode, batched and prefill paths each do): parts of
 * sizes[0..n) bytes, one after another, each starting at a multiple of 256 bytes. parts_bytes is what to allocate;
 * split_parts gives each part's address in the allocation at `base`. */
constexpr size_t PART_ALIGN = 256;
inline size_t parts_bytes(const size_t *sizes, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += align_up(sizes[i], PART_ALIGN);
    return total;
}
inline void split_parts(void *base, const size_t *sizes, int n, void **parts) {
    unsigned char *p = static_cast<unsigned char *>(base);
    for (int i = 0; i < n; i++) {
        parts[i] = p;
        p += align_up(sizes[i], PART_ALIGN);
    }
}

/* The capacity a growing buffer takes: `initial` while empty, doubled until it holds `need`. */
template <typename T>
T grown_capacity(T current, T initial, T need) {
    T capacity = current ? current : initial;
    while (capacity < need) capacity *= 2;
    return capacity;
}

/* Replaces a device buffer and its pinned host twin (the staging of its copies) with new ones of the given sizes;
 * the caller has synchronised the stream and set the capacity it keeps to 0 until this returns KITE_OK. */
template <typename D, typename H>
kite_status replace_device_and_pinned(D **device, size_t device_bytes, H **host, size_t host_bytes) {
    if (*device) CUDA_CHECK(cudaFree(*device));
    if (*host) CUDA_CHECK(cudaFreeHost(*host));
    *device = NULL;
    *host = NULL;
    CUDA_CHECK(cudaMalloc(device, device_bytes));
    CUDA_CHECK(cudaMallocHost(host, host_bytes));
    return KITE_OK;
}

/* Captures what launches() enqueues on `stream` as a graph and instantiates it into *exec (NULL on failure);
 * `what` names the graph in error messages. A failure of launches() is returned as it is. */
template <typename Launches>
kite_status capture_graph(cudaStream_t stream, Launches launches, cudaGraphExec_t *exec, const char *what) {
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const kite_status status = launches();
    cudaGraph_t graph = NULL;
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    if (status != KITE_OK) {
        if (graph) cudaGraphDestroy(graph);
        return status;
    }
    if (end != cudaSuccess)
        return kite_fail(KITE_ERROR_BACKEND, "cuda: cudaStreamEndCapture(%s) failed: %s", what, cudaGetErrorName(end));
    const cudaError_t inst = cudaGraphInstantiate(exec, graph, 0);
    cudaGraphDestroy(graph);
    if (inst != cudaSuccess) {
        *exec = NULL;
        return kite_fail(KITE_ERROR_BACKEND, "cuda: cudaGraphInstantiate(%s) failed: %s", what, cudaGetErrorName(inst));
    }
    return KITE_OK;
}

/* cuda_weights.cu: the weights and the RoPE table into the core. place_weights makes the weight allocation of the
 * core's config (the lm_head the embedding's when tied) and points the core's weights into it; upload_weights
 * places and fills it from a checkpoint's weights. */
kite_status place_weights(cuda_core *core, bool tied);
kite_status upload_weights(cuda_core *core, const qwen3_weights *w);
kite_status upload_rope(cuda_core *core);
/* The layer the bf16 products (cuBLASLt, gemm_rows) read: core->layers[l] itself with bf16 weights; with fp8 weights
 * a copy whose four matrices point into core->fp8_scratch, after enqueueing their dequantization on the core's
 * stream (the scratch is reused by every layer: stream order keeps a layer's products before the next fill). */
kite_status layer_for_gemm(const cuda_core *core, int l, cuda_layer *scratch, const cuda_layer **out);
/* The two halves of that: core->layers[l] with its four bf16 matrices pointed into dst (one layer's worth, laid out
 * as the fused pieces), and the dequantization of layer l's codes into such a view, enqueued on `stream`. */
void fp8_layer_view(const cuda_core *core, int l, bf16 *dst, cuda_layer *view);
kite_status fp8_layer_dequantize(const cuda_core *core, int l, const cuda_layer *view, cudaStream_t stream);

/* fp8_prefetch.cu, the prefill path's route with fp8 weights: create makes the second scratch (layer_elements bf16)
 * and the side stream; begin, at a prefill's start, enqueues layer 0; layer(l) makes the main stream wait for layer
 * l's buffer, enqueues layer l + 1 into the other one and points *out at layer l's; release(l), after layer l's
 * last product, frees its buffer for layer l + 2. */
kite_status fp8_prefetch_create(cuda_core *core, size_t layer_elements);
void fp8_prefetch_free(cuda_core *core);
kite_status fp8_prefetch_begin(const cuda_core *core);
kite_status fp8_prefetch_layer(const cuda_core *core, int l, cuda_layer *view, const cuda_layer **out);
kite_status fp8_prefetch_release(const cuda_core *core, int l);

/* cuda_weight_cache.cu: the weight allocation to and from the weight cache (backend_segment_ops). fill_weights
 * places the allocation and fills it from source, which cuda_weight_layout_check_source accepted for this config. */
extern const backend_segment_ops cuda_segment_ops;
kite_status fill_weights(cuda_core *core, const backend_segment_source *source);

#endif

/* The state the files of the CUDA backend share (C++, never included by host C code; the plain-C entry points
 * for tests and the bench are cuda_backend_internal.h): the device weights of a layer, the backend itself, the
 * layout of the decode step buffers, small helpers (as_cuda, an NVTX range, growing buffers), and the functions one
 * file calls in another.
 *
 *   cuda_backend.cu          creation, destruction, backend_ops, the setters of cuda_backend_internal.h
 *   cuda_read_results.cu     logits, top candidates and argmax ids back to the host
 *   cuda_weights.cu          weights and the RoPE table to the device
 *   cuda_buffers.cu          the general path's growing buffers, the logits rows, a layer's view of the KV cache
 *   cuda_forward_general.cu  the general path (prefill chunks, mixed steps)
 *   cuda_decode.cu           single-stream decode (captured graphs)
 *   cuda_batch.cu            batched decode (2..BATCH_MAX sequences)
 * The kernels these files compose are in kernels/ (kernels/cuda_ops.h is their index).
 */
#ifndef KITE_BACKEND_CUDA_BACKEND_STATE_CUH
#define KITE_BACKEND_CUDA_BACKEND_STATE_CUH

#include "backend/cuda/kernels/cuda_common.cuh"

#include <nvtx3/nvToolsExt.h>

#include "util/options.h"

struct cuda_layer {
    bf16 *qkv;     /* ((n_heads + 2 n_kv_heads) * head_dim, hidden): q_proj, k_proj, v_proj rows */
    bf16 *o;       /* (hidden, n_heads * head_dim) */
    bf16 *gate_up; /* (2 intermediate, hidden): gate_proj rows then up_proj rows */
    bf16 *down;    /* (hidden, intermediate) */
    float *input_norm, *post_norm; /* (hidden) */
    float *q_norm, *k_norm;        /* (head_dim) */
};

/* Step metadata for the decode graph, in device memory: */
enum { STEP_TOKEN = 0, STEP_POSITION = 1, STEP_SLOT = 2, STEP_CONTEXT = 3, STEP_TABLE = 4 };

/* The single-stream decode attention kernels, by the contexts they serve best (measured, docs/cuda.md): the
 * bulk-copy fed cluster kernel up to bulk_max_context, the split-K one beyond (and wherever the device cannot run
 * clusters). */
enum { DECODE_ATTENTION_BULK = 0, DECODE_ATTENTION_SPLIT = 1, N_DECODE_ATTENTION = 2 };

/* Batched decode: graphs per bucket of rows; a step of B sequences runs in the smallest bucket >= B, the
 * rows past B are dummies (token 0, position 0, one position of context in the scratch KV block). The
 * step buffer holds BATCH_MAX tokens, BATCH_MAX context lengths, BATCH_MAX table offsets, then the
 * block tables (entry 0: the scratch block). */
constexpr int N_BUCKETS = 8;
constexpr int32_t BUCKETS[N_BUCKETS] = {2, 4, 8, 16, 32, 64, 128, 256};
constexpr int32_t BATCH_MAX = 256;

enum { BATCH_TOKENS = 0, BATCH_CONTEXT = BATCH_MAX, BATCH_TABLE_START = 2 * BATCH_MAX, BATCH_TABLES = 3 * BATCH_MAX };

struct cuda_backend {
    backend base; /* first: a cuda_backend * is a backend * */
    qwen3_config config;
    int device, sm_count;
    char device_name[256];
    char decode_path[640]; /* cuda_decode_path's report */
    cudaStream_t stream;
    cuda_gemm *gemm;
    runtime_options options; /* the switches as read at creation (src/util/options.h) */
    bool use_graph, use_pdl;
    int attention_bulk; /* cluster size of the bulk-copy fed decode attention (attention_decode_bulk.cu), 0: none */
    int n_splits;
    int split_blocks_per_sm; /* split-K decode attention blocks an SM holds (cuda_attention_decode_blocks_per_sm) */

    void *weight_bytes;  /* one allocation for every weight */
    bf16 *embed, *lm_head;
    float *final_norm;
    cuda_layer *layers;
    float *rope_cos, *rope_sin; /* (rope_positions, head_dim / 2) */
    int32_t rope_positions;

    bf16 *kv_cache;
    int32_t kv_blocks, kv_block_size;
    size_t kv_layer_elements;

    /* General path activations, grown to the largest step. */
    int32_t token_capacity;
    void *activation_bytes;
    float *x;                                   /* (tokens, hidden) residual stream */
    bf16 *normed, *qkv, *q, *attention, *gate_up, *act;
    int32_t *meta_host, *meta_device;           /* pinned / device: token ids, positions, slots, ... */
    size_t meta_capacity;                       /* int32s */
    cudaEvent_t meta_copied;
    float *logits;
    int32_t logits_rows;
    int32_t *ids_device, *ids_host;             /* argmax results (device, pinned) */
    void *top_device, *top_host;                /* read_top's candidates and stats (device, pinned) */
    int32_t top_rows;                           /* rows they hold */

    /* Decode path. */
    float *dec_x, *dec_qkv, *dec_q, *dec_attention, *dec_act, *dec_logits;
    void *dec_attention_ws, *dec_argmax_ws;
    unsigned *dec_counters;
    int32_t *dec_token;                       /* the argmax of the last decode step */
    int32_t *step_device, *step_host;         /* STEP_* then the block table */
    cudaEvent_t step_copied;
    /* After a step chained in place (its token the previous step's argmax on the device), the step's publish
     * kernel moves step_device on to the next position (cuda_publish_and_advance), and the next such step finds
     * there what the host would copy: forward_decode copies only when its values differ (a new block, another
     * sequence, a host token). A copy between two graph launches costs ~1.9 us per step. */
    bool step_advanced;           /* step_device holds step_next_position, token -1 and the table last copied */
    int32_t step_next_position;
    int32_t step_table_copied;    /* entries of that table (step_host holds them) */
    unsigned long long step_copies; /* step buffer copies made (cuda_backend_step_copies) */
    /* Captured decode steps, one per attention kernel (decode_attention_kernel picks one per step by context), with
     * the lm_head as the GEMV (logits kept) or screened ([1]: step_batch.ids_only, where lm_head_screen is set). */
    cudaGraphExec_t graph[2][N_DECODE_ATTENTION];
    /* The lm_head's int8 screen (lm_head_screen.cu; cuda_lm_head_screen_bytes), NULL where it is off
     * (KITE_CUDA_LM_HEAD_SCREEN=0), does not fit the shape, or could not be allocated. */
    void *lm_head_screen;
    int32_t bulk_max_context;

    /* Batched decode path (2..BATCH_MAX sequences, one token each): buffers for bat_capacity rows. */
    int head_groups;       /* blocks per kv head in decode attention (query heads per block: n_heads / n_kv / this) */
    int rows_max;          /* buckets up to this many rows use the fused tensor-core kernels, larger ones cuBLASLt */
    int batch_bulk_max_rows; /* buckets up to this many rows take the bulk-fed cluster attention, where it fits */
    /* cuBLASLt buckets up to batch_split_max_rows rows: o_proj and down as split-K partials (cuda_gemm_bf16_split)
     * in batch_split slices, added to the residual by cuda_residual_rmsnorm together with the next norm (0:
     * cuBLASLt's own products and separate norms). */
    int batch_split, batch_split_max_rows;
    int batch_lm_head_rows_max; /* the lm_head through gemm_rows up to this many rows (at most 32), else cuBLASLt */
    float *bat_partials;
    int bat_bulk_cluster[N_BUCKETS]; /* its cluster size per bucket (0: does not fit, split-K) */
    bool use_batch;
    int32_t bat_capacity;
    void *bat_bytes;
    float *bat_x, *bat_qkv, *bat_logits;
    bf16 *bat_attention16, *bat_normed, *bat_gate_up, *bat_act16;
    void *bat_attention_ws, *bat_argmax_ws;
    unsigned *bat_counters;
    int32_t *bat_ids;
    int32_t *bat_step_device, *bat_step_host;
    size_t bat_step_ints;
    cudaEvent_t bat_step_copied;
    cudaGraphExec_t bat_graphs[N_BUCKETS];

    const float *kept_logits;
    int32_t kept_rows;
    bool kept_decode; /* the kept row came from the decode path: its argmax is already on the device */
    bool kept_batch;  /* the kept rows came from the batched path: their argmax is on the device (bat_ids) */

    /* Overlapped decode (argmax_begin / argmax_end): begun argmaxes in order, a ring of BACKEND_ARGMAX_PENDING
     * pinned buffers, each filled by a copy on the stream and marked by its event. */
    int32_t *begun_host[BACKEND_ARGMAX_PENDING];
    int32_t begun_capacity[BACKEND_ARGMAX_PENDING], begun_rows[BACKEND_ARGMAX_PENDING];
    cudaEvent_t begun_copied[BACKEND_ARGMAX_PENDING];
    int64_t n_begun, n_ended;
    /* The single-stream decode step (graph or launches) writes its id into slot (position & 1) of a mapped host
     * ring itself (cuda_publish_ids, its last kernel), so a begun argmax of it records an event instead of a copy
     * on the stream (tg128 at depth 256 +1.3% against the copy); the batched step its bucket's ids into
     * slot (row 0's context & 1) of a ring of 2 x BATCH_MAX (B=32 +0.7%). kept_published: where the kept
     * step wrote its ids, NULL when it wrote none (the general path). */
    int32_t *publish_host, *publish_device;         /* 2 ints, mapped */
    int32_t *bat_publish_host, *bat_publish_device; /* 2 x BATCH_MAX ints, mapped */
    const volatile int32_t *kept_published;
    const volatile int32_t *begun_mapped[BACKEND_ARGMAX_PENDING]; /* NULL: the copy in begun_host */
};

inline cuda_backend *as_cuda(backend *b) { return reinterpret_cast<cuda_backend *>(b); }

/* A named NVTX range over a scope of host code (what an Nsight Systems timeline shows above the kernels it
 * enqueued); header-only NVTX 3, a no-op unless a profiler is attached. */
struct nvtx_scope {
    explicit nvtx_scope(const char *name) { nvtxRangePushA(name); }
    ~nvtx_scope() { nvtxRangePop(); }
    nvtx_scope(const nvtx_scope &) = delete;
    nvtx_scope &operator=(const nvtx_scope &) = delete;
};

inline size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* Several buffers kept in one device allocation (the decode, batched and general paths each do): parts of
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

/* ---- growing buffers (every path) ------------------------------------------------------------------- */

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

/* ---- the decode paths (cuda_decode.cu, cuda_batch.cu) ----------------------------------------------- */

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

/* ---- what one file calls in another ----------------------------------------------------------------- */

/* cuda_read_results.cu: the backend_ops that read a step's results back, and the device ids of the kept rows'
 * argmax (cuda_forward's tokens when they come from the argmax) */
kite_status kept_argmax_device(cuda_backend *b, int32_t n_rows, const int32_t **ids);
kite_status cuda_read_logits(backend *self, float *out, int32_t n_rows);
kite_status cuda_read_top(backend *self, int32_t n_rows, int32_t k, float *top_logits, int32_t *top_ids,
                          backend_row_top *stats);
kite_status cuda_argmax(backend *self, int32_t *out_ids, int32_t n_rows);
kite_status cuda_argmax_begin(backend *self, int32_t n_rows);
kite_status cuda_argmax_end(backend *self, int32_t *out_ids, int32_t n_rows);

/* cuda_weights.cu */
kite_status upload_weights(cuda_backend *b, const qwen3_weights *w);
kite_status upload_rope(cuda_backend *b);

/* cuda_buffers.cu */
kite_status ensure_tokens(cuda_backend *b, int32_t n_tokens);
kite_status ensure_meta(cuda_backend *b, size_t n_ints);
kite_status ensure_logits(cuda_backend *b, int32_t rows);
cuda_kv_layer kv_layer(cuda_backend *b, int layer);

/* The three forward paths (cuda_forward_general.cu, cuda_decode.cu, cuda_batch.cu), which cuda_forward picks
 * between. chained: the device ids of this step's tokens (overlapped decode), else NULL: the batch's. */
kite_status forward_general(cuda_backend *b, const step_batch *batch, const int32_t *chained);
kite_status forward_decode(cuda_backend *b, const step_batch *batch, const int32_t *chained);
kite_status forward_batch(cuda_backend *b, const step_batch *batch, const int32_t *chained);

/* cuda_decode.cu */
kite_status destroy_decode_graphs(cuda_backend *b);

/* cuda_batch.cu */
int batch_splits(const cuda_backend *b, int32_t rows);
bool batch_split_fits(const qwen3_config *c, int slices);
kite_status destroy_batch_graphs(cuda_backend *b);
kite_status release_batch(cuda_backend *b);
int batch_bulk_cluster(const cuda_backend *b, int32_t rows);

#endif

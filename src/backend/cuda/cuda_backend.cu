/* The CUDA backend: weights on the device (bf16 matrices, fp32 norm vectors), the paged bf16 KV cache,
 * and the forward pass composed from the kernels of this folder.
 *
 * Three paths behind backend_ops.forward:
 * - general (any step batch: prefill chunks and decode tokens of several sequences): cuBLASLt GEMMs,
 *   the tensor-core flash attention over the paged cache, an fp32 residual stream;
 * - single-stream decode (one sequence, one token, logits wanted): GEMV kernels that read each weight
 *   once, attention by the bulk-copy fed cluster kernel up to bulk_max_context (1,024), by the split-K kernel
 *   beyond (the cp.async cluster kernel where cluster_max_context asks for it), lm_head + argmax on the device,
 *   captured as a CUDA graph (one per attention kernel)
 *   and replayed.
 *   Per-step values (token, position, cache slot, context length, block table) live in device memory and
 *   are refreshed by one small copy before each replay; kernels chain by programmatic dependent launch.
 * - batched decode (2..256 sequences, one token each, all wanting logits): the same step for all rows at
 *   once, each weight read once per step: up to 8 rows (KITE_CUDA_ROWS_MAX, at most 32) the tensor-core
 *   kernels of gemm_rows.cu with the GEMV's fusions (5 kernels per layer, PDL), beyond that cuBLASLt
 *   GEMMs; split-K attention over every sequence's own blocks; lm_head + argmax on the device. One CUDA
 *   graph per bucket of rows (2, 4, ..., 256), the rows past B being dummies that write to a scratch KV block.
 */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/decode_attention.cuh" /* decode_group_size */

#include <math.h>
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend_internal.h"

namespace {

/* A named NVTX range over a scope of host code (what an Nsight Systems timeline shows above the kernels it
 * enqueued); header-only NVTX 3, a no-op unless a profiler is attached. */
struct nvtx_scope {
    explicit nvtx_scope(const char *name) { nvtxRangePushA(name); }
    ~nvtx_scope() { nvtxRangePop(); }
    nvtx_scope(const nvtx_scope &) = delete;
    nvtx_scope &operator=(const nvtx_scope &) = delete;
};

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

/* Batched decode: graphs per bucket of rows; a step of B sequences runs in the smallest bucket >= B, the
 * rows past B are dummies (token 0, position 0, one position of context in the scratch KV block). The
 * step buffer holds BATCH_MAX tokens, BATCH_MAX context lengths, BATCH_MAX table offsets, then the
 * block tables (entry 0: the scratch block). */
/* The single-stream decode attention kernels, by the contexts they serve best (measured, docs/notes-cuda.md):
 * the bulk-copy fed cluster kernel up to bulk_max_context, the cp.async one up to cluster_max_context (0 by
 * default: none), the split-K one beyond (and wherever the device cannot run clusters). */
enum { DECODE_ATTENTION_BULK = 0, DECODE_ATTENTION_CLUSTER = 1, DECODE_ATTENTION_SPLIT = 2, N_DECODE_ATTENTION = 3 };

constexpr int N_BUCKETS = 8;
constexpr int32_t BUCKETS[N_BUCKETS] = {2, 4, 8, 16, 32, 64, 128, 256};
constexpr int32_t BATCH_MAX = 256;

enum { BATCH_TOKENS = 0, BATCH_CONTEXT = BATCH_MAX, BATCH_TABLE_START = 2 * BATCH_MAX, BATCH_TABLES = 3 * BATCH_MAX };

/* The smallest bucket holding `rows` rows (rows <= BATCH_MAX). */
int bucket_index(int32_t rows) {
    int bucket = 0;
    while (bucket < N_BUCKETS - 1 && BUCKETS[bucket] < rows) bucket++;
    return bucket;
}

struct cuda_backend {
    backend base; /* first: a cuda_backend * is a backend * */
    qwen3_config config;
    int device, sm_count;
    char device_name[256];
    char decode_path[640]; /* cuda_decode_path's report */
    cudaStream_t stream;
    cuda_gemm *gemm;
    bool use_graph, use_pdl;
    int attention_cluster; /* cluster size of the decode attention (attention_decode_cluster.cu), 0: none */
    int attention_bulk;    /* cluster size of the bulk-copy fed one (attention_decode_bulk.cu), 0: none */
    unsigned anatomy_skip, anatomy_twice; /* bench only: CUDA_DECODE_PART_* masks (cuda_backend_internal.h) */
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
    /* Captured decode steps, one per attention kernel (decode_attention_kernel picks one per step by context). */
    cudaGraphExec_t graph[N_DECODE_ATTENTION];
    int32_t bulk_max_context;
    int32_t cluster_max_context;
    /* The same step as one persistent kernel (decode_persistent.cu), when the shapes and device allow. */
    bool use_persistent;
    int persistent_blocks;
    cuda_decode_args persistent;
    cuda_decode_layer *persistent_layers; /* device */

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
     * on the stream (tg128 at depth 256 +1.3% against the copy, s12r4); the batched step its bucket's ids into
     * slot (row 0's context & 1) of a ring of 2 x BATCH_MAX (B=32 +0.7%, s12r6). kept_published: where the kept
     * step wrote its ids, NULL when it wrote none (the persistent kernel, the general path). */
    int32_t *publish_host, *publish_device;         /* 2 ints, mapped */
    int32_t *bat_publish_host, *bat_publish_device; /* 2 x BATCH_MAX ints, mapped */
    const volatile int32_t *kept_published;
    const volatile int32_t *begun_mapped[BACKEND_ARGMAX_PENDING]; /* NULL: the copy in begun_host */
};

cuda_backend *as_cuda(backend *b) { return reinterpret_cast<cuda_backend *>(b); }

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* ---- weights ---------------------------------------------------------------------------------------- */

kite_status check_view(const tensor_view *t, int64_t rows, int64_t cols, const char *what, int layer) {
    const bool ok = t->data && ((cols == 0 && t->n_dims == 1 && t->shape[0] == rows) ||
                                (cols > 0 && t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols));
    if (!ok)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: layer %d %s has shape (%lld, %lld), expected (%lld, %lld)",
                         layer, what, (long long)t->shape[0], (long long)(t->n_dims == 2 ? t->shape[1] : 0),
                         (long long)rows, (long long)cols);
    return KITE_OK;
}

/* Copies a matrix to bf16 device memory, converting F16 / F32 on the host through `staging`. */
kite_status upload_matrix(bf16 *dst, const tensor_view *t, float *staging_f32, uint16_t *staging_bf16,
                          size_t staging_elements) {
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

kite_status upload_vector(float *dst, const tensor_view *t, float *staging_f32) {
    const size_t n = tensor_view_elements(t);
    tensor_to_float(t->dtype, t->data, staging_f32, n);
    CUDA_CHECK(cudaMemcpy(dst, staging_f32, n * sizeof(float), cudaMemcpyHostToDevice));
    return KITE_OK;
}

kite_status upload_weights(cuda_backend *b, const qwen3_weights *w) {
    const qwen3_config *c = &b->config;
    const int64_t hidden = c->hidden_size, inter = c->intermediate_size, hd = c->head_dim;
    const int64_t q_rows = (int64_t)c->n_heads * hd, kv_rows = (int64_t)c->n_kv_heads * hd;
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

    /* Sizes in bytes, each tensor 256-byte aligned. */
    const size_t A = 256;
    const size_t matrix_embed = align_up((size_t)c->vocab_size * (size_t)hidden * 2, A);
    const size_t m_qkv = align_up((size_t)(q_rows + 2 * kv_rows) * (size_t)hidden * 2, A);
    const size_t m_o = align_up((size_t)hidden * (size_t)q_rows * 2, A);
    const size_t m_gu = align_up((size_t)(2 * inter) * (size_t)hidden * 2, A);
    const size_t m_down = align_up((size_t)hidden * (size_t)inter * 2, A);
    const size_t v_hidden = align_up((size_t)hidden * 4, A), v_head = align_up((size_t)hd * 4, A);
    const size_t per_layer = m_qkv + m_o + m_gu + m_down + 2 * v_hidden + 2 * v_head;
    const size_t total = matrix_embed * (tied ? 1 : 2) + v_hidden + per_layer * (size_t)c->n_layers;
    CUDA_CHECK(cudaMalloc(&b->weight_bytes, total));

    unsigned char *p = static_cast<unsigned char *>(b->weight_bytes);
    auto take = [&](size_t bytes) {
        void *r = p;
        p += bytes;
        return r;
    };
    b->embed = static_cast<bf16 *>(take(matrix_embed));
    b->lm_head = tied ? b->embed : static_cast<bf16 *>(take(matrix_embed));
    b->final_norm = static_cast<float *>(take(v_hidden));
    b->layers = static_cast<cuda_layer *>(calloc((size_t)c->n_layers, sizeof(cuda_layer)));
    if (!b->layers) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cuda backend: out of host memory");
    for (int l = 0; l < c->n_layers; l++) {
        cuda_layer *L = &b->layers[l];
        L->qkv = static_cast<bf16 *>(take(m_qkv));
        L->o = static_cast<bf16 *>(take(m_o));
        L->gate_up = static_cast<bf16 *>(take(m_gu));
        L->down = static_cast<bf16 *>(take(m_down));
        L->input_norm = static_cast<float *>(take(v_hidden));
        L->post_norm = static_cast<float *>(take(v_hidden));
        L->q_norm = static_cast<float *>(take(v_head));
        L->k_norm = static_cast<float *>(take(v_head));
    }

    const size_t staging_elements = 1u << 22;
    float *staging_f32 = static_cast<float *>(malloc(staging_elements * sizeof(float)));
    uint16_t *staging_bf16 = static_cast<uint16_t *>(malloc(staging_elements * sizeof(uint16_t)));
    kite_status status = KITE_OK;
    if (!staging_f32 || !staging_bf16) status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cuda backend: out of host memory");
#define UPLOAD(expr)                                                                                     \
    if (status == KITE_OK) status = (expr)
    UPLOAD(upload_matrix(b->embed, &w->embed_tokens, staging_f32, staging_bf16, staging_elements));
    if (!tied) UPLOAD(upload_matrix(b->lm_head, &w->lm_head, staging_f32, staging_bf16, staging_elements));
    UPLOAD(upload_vector(b->final_norm, &w->final_norm, staging_f32));
    for (int l = 0; l < c->n_layers && status == KITE_OK; l++) {
        const qwen3_layer_weights *lw = &w->layers[l];
        cuda_layer *L = &b->layers[l];
        UPLOAD(upload_matrix(L->qkv, &lw->q_proj, staging_f32, staging_bf16, staging_elements));
        UPLOAD(upload_matrix(L->qkv + (size_t)q_rows * hidden, &lw->k_proj, staging_f32, staging_bf16, staging_elements));
        UPLOAD(upload_matrix(L->qkv + (size_t)(q_rows + kv_rows) * hidden, &lw->v_proj, staging_f32, staging_bf16,
                             staging_elements));
        UPLOAD(upload_matrix(L->o, &lw->o_proj, staging_f32, staging_bf16, staging_elements));
        UPLOAD(upload_matrix(L->gate_up, &lw->gate_proj, staging_f32, staging_bf16, staging_elements));
        UPLOAD(upload_matrix(L->gate_up + (size_t)inter * hidden, &lw->up_proj, staging_f32, staging_bf16,
                             staging_elements));
        UPLOAD(upload_matrix(L->down, &lw->down_proj, staging_f32, staging_bf16, staging_elements));
        UPLOAD(upload_vector(L->input_norm, &lw->input_norm, staging_f32));
        UPLOAD(upload_vector(L->post_norm, &lw->post_attention_norm, staging_f32));
        UPLOAD(upload_vector(L->q_norm, &lw->q_norm, staging_f32));
        UPLOAD(upload_vector(L->k_norm, &lw->k_norm, staging_f32));
    }
#undef UPLOAD
    free(staging_f32);
    free(staging_bf16);
    return status;
}

/* RoPE angles in double, as the CPU reference computes them: inv_freq_i = theta^(-2i/d). */
kite_status upload_rope(cuda_backend *b) {
    const qwen3_config *c = &b->config;
    const int half = c->head_dim / 2;
    const int32_t positions = c->max_position_embeddings > 0 ? c->max_position_embeddings : 32768;
    const size_t n = (size_t)positions * (size_t)half;
    float *cos_host = static_cast<float *>(malloc(n * sizeof(float)));
    float *sin_host = static_cast<float *>(malloc(n * sizeof(float)));
    double *inv_freq = static_cast<double *>(malloc((size_t)half * sizeof(double)));
    if (!cos_host || !sin_host || !inv_freq) {
        free(cos_host);
        free(sin_host);
        free(inv_freq);
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cuda backend: out of host memory for the RoPE table");
    }
    for (int i = 0; i < half; i++) inv_freq[i] = pow(c->rope_theta, -2.0 * (double)i / (double)c->head_dim);
    for (int32_t p = 0; p < positions; p++)
        for (int i = 0; i < half; i++) {
            const double angle = (double)p * inv_freq[i];
            cos_host[(size_t)p * half + i] = (float)cos(angle);
            sin_host[(size_t)p * half + i] = (float)sin(angle);
        }
    free(inv_freq);
    kite_status status = KITE_OK;
    cudaError_t e1 = cudaMalloc(&b->rope_cos, n * sizeof(float));
    cudaError_t e2 = cudaMalloc(&b->rope_sin, n * sizeof(float));
    if (e1 == cudaSuccess && e2 == cudaSuccess) {
        e1 = cudaMemcpy(b->rope_cos, cos_host, n * sizeof(float), cudaMemcpyHostToDevice);
        e2 = cudaMemcpy(b->rope_sin, sin_host, n * sizeof(float), cudaMemcpyHostToDevice);
    }
    if (e1 != cudaSuccess || e2 != cudaSuccess)
        status = kite_fail(KITE_ERROR_BACKEND, "cuda: uploading the RoPE table failed: %s",
                           cudaGetErrorName(e1 != cudaSuccess ? e1 : e2));
    free(cos_host);
    free(sin_host);
    b->rope_positions = positions;
    return status;
}

/* ---- buffers ---------------------------------------------------------------------------------------- */

kite_status ensure_tokens(cuda_backend *b, int32_t n_tokens) {
    if (n_tokens <= b->token_capacity) return KITE_OK;
    const qwen3_config *c = &b->config;
    int32_t capacity = b->token_capacity ? b->token_capacity : 256;
    while (capacity < n_tokens) capacity *= 2;
    const size_t T = (size_t)capacity, A = 256;
    const size_t hidden = c->hidden_size, qd = (size_t)c->n_heads * c->head_dim;
    const size_t qkv = (size_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim, inter = c->intermediate_size;
    const size_t sizes[7] = {T * hidden * 4, T * hidden * 2, T * qkv * 2, T * qd * 2, T * qd * 2, T * 2 * inter * 2, T * inter * 2};
    size_t total = 0;
    for (int i = 0; i < 7; i++) total += align_up(sizes[i], A);
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    if (b->activation_bytes) CUDA_CHECK(cudaFree(b->activation_bytes));
    b->activation_bytes = NULL;
    b->token_capacity = 0;
    CUDA_CHECK(cudaMalloc(&b->activation_bytes, total));
    unsigned char *p = static_cast<unsigned char *>(b->activation_bytes);
    void *parts[7];
    for (int i = 0; i < 7; i++) {
        parts[i] = p;
        p += align_up(sizes[i], A);
    }
    b->x = static_cast<float *>(parts[0]);
    b->normed = static_cast<bf16 *>(parts[1]);
    b->qkv = static_cast<bf16 *>(parts[2]);
    b->q = static_cast<bf16 *>(parts[3]);
    b->attention = static_cast<bf16 *>(parts[4]);
    b->gate_up = static_cast<bf16 *>(parts[5]);
    b->act = static_cast<bf16 *>(parts[6]);
    b->token_capacity = capacity;
    return KITE_OK;
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

kite_status ensure_meta(cuda_backend *b, size_t n_ints) {
    if (n_ints <= b->meta_capacity) return KITE_OK;
    const size_t capacity = grown_capacity(b->meta_capacity, (size_t)4096, n_ints);
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    b->meta_capacity = 0;
    KITE_TRY(replace_device_and_pinned(&b->meta_device, capacity * sizeof(int32_t), &b->meta_host,
                                       capacity * sizeof(int32_t)));
    b->meta_capacity = capacity;
    return KITE_OK;
}

kite_status ensure_logits(cuda_backend *b, int32_t rows) {
    if (rows <= b->logits_rows) return KITE_OK;
    const int32_t capacity = grown_capacity(b->logits_rows, (int32_t)8, rows);
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    if (b->logits) CUDA_CHECK(cudaFree(b->logits));
    b->logits = NULL;
    b->logits_rows = 0;
    CUDA_CHECK(cudaMalloc(&b->logits, (size_t)capacity * (size_t)b->config.vocab_size * sizeof(float)));
    KITE_TRY(replace_device_and_pinned(&b->ids_device, (size_t)capacity * sizeof(int32_t), &b->ids_host,
                                       (size_t)capacity * sizeof(int32_t)));
    b->logits_rows = capacity;
    return KITE_OK;
}

cuda_kv_layer kv_layer(cuda_backend *b, int layer) {
    cuda_kv_layer kv;
    kv.base = b->kv_cache + (size_t)layer * b->kv_layer_elements;
    kv.block_size = b->kv_block_size;
    kv.n_kv_heads = b->config.n_kv_heads;
    kv.head_dim = b->config.head_dim;
    return kv;
}

/* ---- the general path ------------------------------------------------------------------------------- */

kite_status forward_general(cuda_backend *b, const step_batch *batch, const int32_t *chained) {
    const qwen3_config *c = &b->config;
    const int32_t T = batch->n_tokens, S = batch->n_seqs, bs = b->kv_block_size;
    int32_t rows = 0;
    size_t table_ints = 0;
    int32_t max_new = 0;
    for (int32_t s = 0; s < S; s++) {
        rows += batch->seq_wants_logits[s] ? 1 : 0;
        table_ints += (size_t)KITE_CEIL_DIV(batch->seq_context_len[s], bs);
        const int32_t n_new = batch->seq_token_start[s + 1] - batch->seq_token_start[s];
        if (n_new > max_new) max_new = n_new;
    }
    KITE_TRY(ensure_tokens(b, T));
    if (rows > 0) KITE_TRY(ensure_logits(b, rows));
    const size_t n_ints = 3 * (size_t)T + (size_t)(S + 1) + 2 * (size_t)S + table_ints + (size_t)rows;
    KITE_TRY(ensure_meta(b, n_ints));
    CUDA_CHECK(cudaEventSynchronize(b->meta_copied)); /* the previous step's copy has left the host buffer */

    int32_t *h = b->meta_host;
    int32_t *ids = h, *positions = ids + T, *slots = positions + T, *token_start = slots + T;
    int32_t *ctx = token_start + S + 1, *table_start = ctx + S, *tables = table_start + S;
    int32_t *logit_rows = tables + table_ints;
    if (chained) /* the ids are copied on the device below */
        memset(ids, 0, (size_t)T * sizeof(int32_t));
    else
        memcpy(ids, batch->token_ids, (size_t)T * sizeof(int32_t));
    size_t table_at = 0;
    int32_t row = 0;
    for (int32_t s = 0; s < S; s++) {
        const int32_t start = batch->seq_token_start[s], n_new = batch->seq_token_start[s + 1] - start;
        const int32_t context = batch->seq_context_len[s], n_blocks = KITE_CEIL_DIV(context, bs);
        token_start[s] = start;
        ctx[s] = context;
        table_start[s] = (int32_t)table_at;
        memcpy(tables + table_at, batch->block_tables[s], (size_t)n_blocks * sizeof(int32_t));
        for (int32_t i = 0; i < n_new; i++) {
            const int32_t position = context - n_new + i;
            positions[start + i] = position;
            slots[start + i] = batch->block_tables[s][position / bs] * bs + position % bs;
        }
        table_at += (size_t)n_blocks;
        if (batch->seq_wants_logits[s]) logit_rows[row++] = start + n_new - 1;
    }
    token_start[S] = batch->seq_token_start[S];
    CUDA_CHECK(cudaMemcpyAsync(b->meta_device, h, n_ints * sizeof(int32_t), cudaMemcpyHostToDevice, b->stream));
    CUDA_CHECK(cudaEventRecord(b->meta_copied, b->stream));
    if (chained) /* one token per sequence: the previous step's argmax rows, in order */
        CUDA_CHECK(cudaMemcpyAsync(b->meta_device, chained, (size_t)T * sizeof(int32_t), cudaMemcpyDeviceToDevice,
                                   b->stream));

    int32_t *d = b->meta_device;
    const int32_t *d_ids = d, *d_positions = d + T, *d_slots = d + 2 * T, *d_token_start = d + 3 * T;
    const int32_t *d_ctx = d_token_start + S + 1, *d_table_start = d_ctx + S, *d_tables = d_table_start + S;
    const int32_t *d_logit_rows = d_tables + table_ints;
    cuda_seq_meta seqs;
    seqs.token_start = d_token_start;
    seqs.context_len = d_ctx;
    seqs.block_table_start = d_table_start;
    seqs.block_tables = d_tables;
    seqs.n_seqs = S;
    seqs.max_new_tokens = max_new;

    void *st = b->stream;
    const int hidden = c->hidden_size, inter = c->intermediate_size;
    const int qd = c->n_heads * c->head_dim, qkv_dim = (c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    const float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)c->head_dim);
    KITE_TRY(cuda_embed(b->embed, d_ids, NULL, b->x, T, hidden, st, 0));
    for (int l = 0; l < c->n_layers; l++) {
        const cuda_layer *L = &b->layers[l];
        const cuda_kv_layer kv = kv_layer(b, l);
        KITE_TRY(cuda_rmsnorm(b->x, L->input_norm, b->normed, NULL, T, hidden, eps, st));
        KITE_TRY(cuda_gemm_bf16(b->gemm, b->normed, L->qkv, b->qkv, 0, 0.0f, T, qkv_dim, hidden, st));
        KITE_TRY(cuda_qk_norm_rope_kv(b->qkv, b->q, 0, d_positions, d_slots, L->q_norm, L->k_norm, b->rope_cos,
                                      b->rope_sin, kv, T, c->n_heads, eps, st, 0));
        KITE_TRY(cuda_attention_prefill(b->q, b->attention, kv, seqs, c->n_heads, scale, st));
        KITE_TRY(cuda_gemm_bf16(b->gemm, b->attention, L->o, b->x, 1, 1.0f, T, hidden, qd, st));
        KITE_TRY(cuda_rmsnorm(b->x, L->post_norm, b->normed, NULL, T, hidden, eps, st));
        KITE_TRY(cuda_gemm_bf16(b->gemm, b->normed, L->gate_up, b->gate_up, 0, 0.0f, T, 2 * inter, hidden, st));
        KITE_TRY(cuda_swiglu(b->gate_up, b->act, T, inter, st));
        KITE_TRY(cuda_gemm_bf16(b->gemm, b->act, L->down, b->x, 1, 1.0f, T, hidden, inter, st));
    }
    if (rows > 0) {
        KITE_TRY(cuda_rmsnorm(b->x, b->final_norm, b->normed, d_logit_rows, rows, hidden, eps, st));
        KITE_TRY(cuda_gemm_bf16(b->gemm, b->normed, b->lm_head, b->logits, 1, 0.0f, rows, c->vocab_size, hidden, st));
    }
    b->kept_logits = b->logits;
    b->kept_rows = rows;
    b->kept_decode = false;
    b->kept_batch = false;
    b->kept_published = NULL;
    return KITE_OK;
}

/* ---- the decode path -------------------------------------------------------------------------------- */

/* Launches one part of the decode step: not at all, once, or twice, as the bench's anatomy mode asks
 * (results are then wrong; it only times what each part costs in the graph). */
#define DECODE_PART(part, launch)                                                                        \
    do {                                                                                                 \
        if (!(b->anatomy_skip & (part))) KITE_TRY(launch);                                               \
        if (b->anatomy_twice & (part)) KITE_TRY(launch);                                                 \
    } while (0)

int decode_attention_kernel(const cuda_backend *b, int32_t context) {
    if (b->attention_bulk > 0 && context <= b->bulk_max_context) return DECODE_ATTENTION_BULK;
    if (b->attention_cluster > 0 && context <= b->cluster_max_context) return DECODE_ATTENTION_CLUSTER;
    return DECODE_ATTENTION_SPLIT;
}

kite_status decode_launches(cuda_backend *b, int attention) {
    const qwen3_config *c = &b->config;
    void *st = b->stream;
    const int pdl = b->use_pdl ? 1 : 0;
    const int hidden = c->hidden_size, inter = c->intermediate_size;
    const int qd = c->n_heads * c->head_dim, qkv_dim = (c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    const float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)c->head_dim);
    const int32_t *step = b->step_device;
    /* A negative token: the previous decode step's argmax (overlapped decode, forward_decode). */
    DECODE_PART(CUDA_DECODE_PART_EMBED,
                cuda_embed(b->embed, step + STEP_TOKEN, b->dec_token, b->dec_x, 1, hidden, st, 0));
    for (int l = 0; l < c->n_layers; l++) {
        const cuda_layer *L = &b->layers[l];
        const cuda_kv_layer kv = kv_layer(b, l);
        DECODE_PART(CUDA_DECODE_PART_QKV, cuda_gemv(L->qkv, b->dec_x, L->input_norm, eps, b->dec_qkv, qkv_dim, hidden,
                                                    CUDA_GEMV_STORE, NULL, NULL, st, pdl));
        if (attention == DECODE_ATTENTION_BULK)
            DECODE_PART(CUDA_DECODE_PART_ATTENTION,
                        cuda_attention_decode_bulk(b->dec_qkv, b->dec_attention, kv, step + STEP_TABLE,
                                                   step + STEP_CONTEXT, L->q_norm, L->k_norm, b->rope_cos, b->rope_sin,
                                                   eps, c->n_heads, scale, b->attention_bulk, st, pdl));
        else if (attention == DECODE_ATTENTION_CLUSTER)
            DECODE_PART(CUDA_DECODE_PART_ATTENTION,
                        cuda_attention_decode_cluster(b->dec_qkv, b->dec_attention, kv, step + STEP_TABLE,
                                                      step + STEP_CONTEXT, L->q_norm, L->k_norm, b->rope_cos,
                                                      b->rope_sin, eps, c->n_heads, scale, b->attention_cluster, st, pdl));
        else
            DECODE_PART(CUDA_DECODE_PART_ATTENTION,
                        cuda_attention_decode(b->dec_qkv, b->dec_attention, kv, step + STEP_TABLE, step + STEP_CONTEXT,
                                              L->q_norm, L->k_norm, b->rope_cos, b->rope_sin, eps, c->n_heads, scale,
                                              b->n_splits, b->dec_attention_ws, b->dec_counters, st, pdl));
        /* x was last written by the down projection three kernels back (or the embedding), and for the down
         * projection by o_proj two kernels back: ADD_SETTLED reads it before the PDL wait (measured: 0.674 vs
         * 0.684 ms per 0.6B token). The anatomy mode's doubled o_proj / down break that premise (timing only). */
        DECODE_PART(CUDA_DECODE_PART_O, cuda_gemv(L->o, b->dec_attention, NULL, 0.0f, b->dec_x, hidden, qd,
                                                  CUDA_GEMV_ADD_SETTLED, NULL, NULL, st, pdl));
        DECODE_PART(CUDA_DECODE_PART_GATE_UP, cuda_gemv(L->gate_up, b->dec_x, L->post_norm, eps, b->dec_act, 2 * inter,
                                                        hidden, CUDA_GEMV_SWIGLU, NULL, NULL, st, pdl));
        DECODE_PART(CUDA_DECODE_PART_DOWN, cuda_gemv(L->down, b->dec_act, NULL, 0.0f, b->dec_x, hidden, inter,
                                                     CUDA_GEMV_ADD_SETTLED, NULL, NULL, st, pdl));
    }
    DECODE_PART(CUDA_DECODE_PART_LM_HEAD, cuda_gemv(b->lm_head, b->dec_x, b->final_norm, eps, b->dec_logits,
                                                    c->vocab_size, hidden, CUDA_GEMV_ARGMAX, b->dec_argmax_ws,
                                                    b->dec_token, st, pdl));
    KITE_TRY(cuda_publish_ids(b->dec_token, 1, step + STEP_POSITION, b->publish_device, st, pdl));
    return KITE_OK;
}

kite_status capture_decode_graph(cuda_backend *b, int which) {
    CUDA_CHECK(cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal));
    kite_status status = decode_launches(b, which);
    cudaGraph_t graph = NULL;
    const cudaError_t end = cudaStreamEndCapture(b->stream, &graph);
    if (status != KITE_OK) {
        if (graph) cudaGraphDestroy(graph);
        return status;
    }
    if (end != cudaSuccess)
        return kite_fail(KITE_ERROR_BACKEND, "cuda: cudaStreamEndCapture(decode graph) failed: %s", cudaGetErrorName(end));
    const cudaError_t inst = cudaGraphInstantiate(&b->graph[which], graph, 0);
    cudaGraphDestroy(graph);
    if (inst != cudaSuccess) {
        b->graph[which] = NULL;
        return kite_fail(KITE_ERROR_BACKEND, "cuda: cudaGraphInstantiate(decode graph) failed: %s", cudaGetErrorName(inst));
    }
    return KITE_OK;
}

kite_status destroy_decode_graphs(cuda_backend *b) {
    for (int i = 0; i < N_DECODE_ATTENTION; i++) {
        if (b->graph[i]) CUDA_CHECK(cudaGraphExecDestroy(b->graph[i]));
        b->graph[i] = NULL;
    }
    return KITE_OK;
}

/* chained: the device id of this step's token (overlapped decode), else NULL: the batch's. */
kite_status forward_decode(cuda_backend *b, const step_batch *batch, const int32_t *chained) {
    const int32_t bs = b->kv_block_size, context = batch->seq_context_len[0];
    const int32_t position = context - 1, n_blocks = KITE_CEIL_DIV(context, bs);
    const bool persistent = b->use_persistent && bs % 16 == 0; /* the kernel copies K/V in pieces of 16 slots */
    /* The graphs' embedding reads dec_token for a negative id; the persistent kernel reads the id itself. */
    const bool chained_in_place = chained == b->dec_token && !persistent;
    CUDA_CHECK(cudaEventSynchronize(b->step_copied));
    int32_t *h = b->step_host;
    h[STEP_TOKEN] = chained ? (chained_in_place ? -1 : 0) : batch->token_ids[0];
    h[STEP_POSITION] = position;
    h[STEP_SLOT] = batch->block_tables[0][position / bs] * bs + position % bs;
    h[STEP_CONTEXT] = context;
    memcpy(h + STEP_TABLE, batch->block_tables[0], (size_t)n_blocks * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(b->step_device, h, (size_t)(STEP_TABLE + n_blocks) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, b->stream));
    CUDA_CHECK(cudaEventRecord(b->step_copied, b->stream));
    if (chained && !chained_in_place)
        CUDA_CHECK(cudaMemcpyAsync(b->step_device + STEP_TOKEN, chained, sizeof(int32_t), cudaMemcpyDeviceToDevice,
                                   b->stream));
    if (persistent) {
        cuda_decode_args *a = &b->persistent;
        a->kv_cache = b->kv_cache; /* kv_reserve may have moved these */
        a->kv_block_size = bs;
        a->kv_layer_elements = b->kv_layer_elements;
        a->token = b->step_device + STEP_TOKEN;
        a->context_len = b->step_device + STEP_CONTEXT;
        a->block_table = b->step_device + STEP_TABLE;
        KITE_TRY(cuda_decode_persistent(a, b->persistent_blocks, b->stream));
    } else {
        const int attention = decode_attention_kernel(b, context);
        if (b->use_graph) {
            if (!b->graph[attention]) KITE_TRY(capture_decode_graph(b, attention));
            CUDA_CHECK(cudaGraphLaunch(b->graph[attention], b->stream));
        } else {
            KITE_TRY(decode_launches(b, attention));
        }
    }
    b->kept_logits = b->dec_logits;
    b->kept_rows = 1;
    b->kept_decode = true;
    b->kept_published = persistent ? NULL : b->publish_host + (position & 1);
    b->kept_batch = false;
    return KITE_OK;
}


/* Prepares the persistent decode kernel over the decode buffers; leaves use_persistent off (and the
 * graph path in charge) when the kernel does not suit the model or the device. */
kite_status setup_persistent_decode(cuda_backend *b) {
    const qwen3_config *c = &b->config;
    cuda_decode_args *a = &b->persistent;
    memset(a, 0, sizeof *a);
    a->n_layers = c->n_layers;
    a->hidden = c->hidden_size;
    a->intermediate = c->intermediate_size;
    a->n_heads = c->n_heads;
    a->n_kv_heads = c->n_kv_heads;
    a->head_dim = c->head_dim;
    a->vocab = c->vocab_size;
    a->eps = (float)c->rms_norm_eps;
    a->embed = b->embed;
    a->lm_head = b->lm_head;
    a->final_norm = b->final_norm;
    a->rope_cos = b->rope_cos;
    a->rope_sin = b->rope_sin;
    a->x = b->dec_x;
    a->qkv = b->dec_qkv;
    a->attention = b->dec_attention;
    a->act = b->dec_act;
    a->logits = b->dec_logits;
    a->token_out = b->dec_token;
    size_t workspace = 0;
    if (cuda_decode_persistent_plan(a, &b->persistent_blocks, &workspace) != KITE_OK) {
        b->use_persistent = false;
        return KITE_OK;
    }
    cuda_decode_layer *host = static_cast<cuda_decode_layer *>(calloc((size_t)c->n_layers, sizeof(cuda_decode_layer)));
    if (!host) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cuda backend: out of host memory");
    for (int l = 0; l < c->n_layers; l++) {
        const cuda_layer *L = &b->layers[l];
        host[l] = cuda_decode_layer{L->qkv, L->o, L->gate_up, L->down, L->input_norm, L->post_norm, L->q_norm, L->k_norm};
    }
    const size_t layer_bytes = (size_t)c->n_layers * sizeof(cuda_decode_layer);
    cudaError_t e = cudaMalloc(&b->persistent_layers, layer_bytes);
    if (e == cudaSuccess) e = cudaMemcpy(b->persistent_layers, host, layer_bytes, cudaMemcpyHostToDevice);
    free(host);
    if (e == cudaSuccess) e = cudaMalloc(&a->workspace, workspace);
    if (e == cudaSuccess) e = cudaMemset(a->workspace, 0, workspace); /* the stage counters start at zero */
    if (e != cudaSuccess) {
        cudaFree(b->persistent_layers);
        cudaFree(a->workspace);
        b->persistent_layers = NULL;
        a->workspace = NULL;
        return kite_fail(KITE_ERROR_BACKEND, "cuda: persistent decode buffers: %s", cudaGetErrorName(e));
    }
    a->layers = b->persistent_layers;
    return KITE_OK;
}

/* ---- the batched decode path ------------------------------------------------------------------------ */

/* Splits per (sequence, kv head, head group) of the split-K attention for `rows` sequences: as many as fill the
 * device once (split_blocks_per_sm blocks per SM). The single-stream graph uses rows = 1. */
int batch_splits(const cuda_backend *b, int32_t rows) {
    const int blocks = b->split_blocks_per_sm * (b->sm_count ? b->sm_count : 132);
    const int splits = blocks / (b->config.n_kv_heads * b->head_groups * rows);
    return splits < 1 ? 1 : splits;
}

/* Whether a split of o_proj and down into `slices` k slices fits the shapes (cuda_gemm_bf16_split). */
bool batch_split_fits(const qwen3_config *c, int slices) {
    const int qd = c->n_heads * c->head_dim;
    return slices >= 2 && slices <= 16 && qd % (8 * slices) == 0 && c->intermediate_size % (8 * slices) == 0;
}

kite_status destroy_batch_graphs(cuda_backend *b) {
    for (int i = 0; i < N_BUCKETS; i++)
        if (b->bat_graphs[i]) {
            CUDA_CHECK(cudaGraphExecDestroy(b->bat_graphs[i]));
            b->bat_graphs[i] = NULL;
        }
    return KITE_OK;
}

/* Activations for `rows` rows (a bucket), fixed until a larger bucket comes (then graphs are recaptured). */
/* Frees the batch activations (and the graphs that captured them); the kept batch rows lived there too. */
kite_status release_batch(cuda_backend *b) {
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    KITE_TRY(destroy_batch_graphs(b));
    if (b->bat_bytes) CUDA_CHECK(cudaFree(b->bat_bytes));
    b->bat_bytes = NULL;
    b->bat_capacity = 0;
    if (b->kept_batch) {
        b->kept_logits = NULL;
        b->kept_rows = 0;
        b->kept_batch = false;
        b->kept_published = NULL;
    }
    return KITE_OK;
}

kite_status ensure_batch(cuda_backend *b, int32_t rows) {
    if (rows <= b->bat_capacity) return KITE_OK;
    const qwen3_config *c = &b->config;
    KITE_TRY(release_batch(b));
    const size_t R = (size_t)rows, A = 256;
    const size_t hidden = c->hidden_size, qkv_dim = (size_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    const size_t qd = (size_t)c->n_heads * c->head_dim, inter = c->intermediate_size, vocab = c->vocab_size;
    size_t attention_ws = 0;
    for (int i = 0; i < N_BUCKETS && BUCKETS[i] <= rows; i++) {
        const size_t ws = (size_t)BUCKETS[i] * cuda_attention_decode_workspace(c->n_heads, c->head_dim, batch_splits(b, BUCKETS[i]));
        if (ws > attention_ws) attention_ws = ws;
    }
    enum { X, QKV, LOGITS, ATT16, NORMED, GATE_UP, ACT16, ATT_WS, ARGMAX_WS, COUNTERS, IDS, PARTIALS, N_PARTS };
    size_t sizes[N_PARTS];
    sizes[X] = R * hidden * 4;
    sizes[QKV] = R * qkv_dim * 4;
    sizes[LOGITS] = R * vocab * 4;
    sizes[ATT16] = R * qd * 2;
    sizes[NORMED] = R * hidden * 2;
    sizes[GATE_UP] = R * 2 * inter * 2;
    sizes[ACT16] = R * inter * 2;
    sizes[ATT_WS] = attention_ws;
    sizes[ARGMAX_WS] = cuda_gemm_rows_argmax_workspace();
    sizes[COUNTERS] = R * (size_t)c->n_heads * sizeof(unsigned);
    sizes[IDS] = R * sizeof(int32_t);
    sizes[PARTIALS] = b->batch_split > 1 ? (size_t)b->batch_split * R * hidden * 4 : 0;
    size_t total = 0;
    for (int i = 0; i < N_PARTS; i++) total += align_up(sizes[i], A);
    CUDA_CHECK(cudaMalloc(&b->bat_bytes, total));
    CUDA_CHECK(cudaMemset(b->bat_bytes, 0, total)); /* counters start at zero; padding rows stay finite */
    unsigned char *p = static_cast<unsigned char *>(b->bat_bytes);
    void *parts[N_PARTS];
    for (int i = 0; i < N_PARTS; i++) {
        parts[i] = p;
        p += align_up(sizes[i], A);
    }
    b->bat_x = static_cast<float *>(parts[X]);
    b->bat_qkv = static_cast<float *>(parts[QKV]);
    b->bat_logits = static_cast<float *>(parts[LOGITS]);
    b->bat_attention16 = static_cast<bf16 *>(parts[ATT16]);
    b->bat_normed = static_cast<bf16 *>(parts[NORMED]);
    b->bat_gate_up = static_cast<bf16 *>(parts[GATE_UP]);
    b->bat_act16 = static_cast<bf16 *>(parts[ACT16]);
    b->bat_attention_ws = parts[ATT_WS];
    b->bat_argmax_ws = parts[ARGMAX_WS];
    b->bat_counters = static_cast<unsigned *>(parts[COUNTERS]);
    b->bat_ids = static_cast<int32_t *>(parts[IDS]);
    b->bat_partials = b->batch_split > 1 ? static_cast<float *>(parts[PARTIALS]) : NULL;
    b->bat_capacity = rows;
    return KITE_OK;
}

/* The step buffer (host pinned + device) for `table_ints` block-table entries. */
kite_status ensure_batch_step(cuda_backend *b, size_t table_ints) {
    const size_t need = (size_t)BATCH_TABLES + table_ints;
    if (need <= b->bat_step_ints) return KITE_OK;
    const size_t capacity = grown_capacity(b->bat_step_ints, (size_t)BATCH_TABLES + 4096, need);
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    KITE_TRY(destroy_batch_graphs(b));
    b->bat_step_ints = 0;
    KITE_TRY(replace_device_and_pinned(&b->bat_step_device, capacity * sizeof(int32_t), &b->bat_step_host,
                                       capacity * sizeof(int32_t)));
    b->bat_step_ints = capacity;
    return KITE_OK;
}

/* The cluster size of the bulk-fed attention for a bucket of `rows` rows, 0 for the split-K kernel: buckets
 * up to batch_bulk_max_rows whose clusters (of 1 to 16 blocks per sequence and kv head) all fit at once. */
int batch_bulk_cluster(const cuda_backend *b, int32_t rows) {
    return rows <= b->batch_bulk_max_rows ? b->bat_bulk_cluster[bucket_index(rows)] : 0;
}

/* The batched attention of one layer (Q/K norm, RoPE and the K/V append fused): the bulk-fed cluster kernel
 * where batch_bulk_cluster() allows, else split-K. */
kite_status batch_attention(cuda_backend *b, int layer, int32_t rows, void *out, int out_bf16, int pdl) {
    const qwen3_config *c = &b->config;
    const cuda_layer *L = &b->layers[layer];
    const float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)c->head_dim);
    const int32_t *step = b->bat_step_device;
    const int32_t *context = step + BATCH_CONTEXT, *table_start = step + BATCH_TABLE_START, *tables = step + BATCH_TABLES;
    const int cluster = batch_bulk_cluster(b, rows);
    if (cluster > 0)
        return cuda_attention_decode_bulk_rows(b->bat_qkv, out, out_bf16, kv_layer(b, layer), tables, table_start,
                                               context, L->q_norm, L->k_norm, b->rope_cos, b->rope_sin, eps,
                                               c->n_heads, scale, rows, cluster, b->stream, pdl);
    return cuda_attention_decode_rows(b->bat_qkv, out, out_bf16, kv_layer(b, layer), tables, table_start, context,
                                      L->q_norm, L->k_norm, b->rope_cos, b->rope_sin, eps, c->n_heads, scale, rows,
                                      batch_splits(b, rows), b->bat_attention_ws, b->bat_counters, b->stream, pdl);
}

/* Whether a bucket of `rows` rows runs its products through gemm_rows (up to rows_max rows, where every
 * product's input rows fit its shared memory; e.g. a 14B model's 17,408-column down projection does not at 8
 * rows) rather than cuBLASLt. Measured and dropped: gemm_rows for 9-32 rows after a separate RMSNorm kernel
 * (session 5: 1.644 vs 1.399 ms per step at B=32 through cuBLASLt), for single products at 32 rows (session 6:
 * each one slower), and gemm_split, which stages only a k slice per block (branch next/gemm-split, session 6:
 * B=32 1.655 ms). */
bool batch_gemm_rows(const cuda_backend *b, int32_t rows) {
    const qwen3_config *c = &b->config;
    return rows <= b->rows_max && cuda_gemm_rows_fits(rows, c->hidden_size) &&
           cuda_gemm_rows_fits(rows, c->n_heads * c->head_dim) && cuda_gemm_rows_fits(rows, c->intermediate_size);
}

/* The lm_head (final norm, logits, argmax) through gemm_rows up to batch_lm_head_rows_max rows where its input
 * fits, else cuBLASLt. normed_ready: bat_normed already holds the final norm of bat_x (the split products' last
 * residual_rmsnorm), so neither path takes the norm again: gemm_rows stages bat_normed as it is (bf16). */
kite_status batch_lm_head(cuda_backend *b, int32_t rows, int pdl, bool normed_ready) {
    const qwen3_config *c = &b->config;
    const int hidden = c->hidden_size, vocab = c->vocab_size;
    const float eps = (float)c->rms_norm_eps;
    void *st = b->stream;
    if (rows <= b->batch_lm_head_rows_max && cuda_gemm_rows_fits(rows, hidden)) {
        const void *input = normed_ready ? static_cast<const void *>(b->bat_normed) : b->bat_x;
        KITE_TRY(cuda_gemm_rows(b->lm_head, input, normed_ready, normed_ready ? NULL : b->final_norm, eps,
                                b->bat_logits, 0, rows, vocab, hidden, CUDA_GEMV_ARGMAX, b->bat_argmax_ws, b->bat_ids,
                                st, pdl));
    } else {
        if (!normed_ready) KITE_TRY(cuda_rmsnorm(b->bat_x, b->final_norm, b->bat_normed, NULL, rows, hidden, eps, st));
        KITE_TRY(cuda_gemm_bf16(b->gemm, b->bat_normed, b->lm_head, b->bat_logits, 1, 0.0f, rows, vocab, hidden, st));
        KITE_TRY(cuda_argmax_rows(b->bat_logits, b->bat_ids, rows, vocab, st));
    }
    /* The ids to the host by the step itself (bat_publish_host), as the single-stream step does. */
    return cuda_publish_ids(b->bat_ids, rows, b->bat_step_device + BATCH_CONTEXT, b->bat_publish_device, st, pdl);
}

kite_status batch_launches(cuda_backend *b, int32_t rows) {
    const qwen3_config *c = &b->config;
    void *st = b->stream;
    const int hidden = c->hidden_size, inter = c->intermediate_size;
    const int qd = c->n_heads * c->head_dim, qkv_dim = (c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    const float eps = (float)c->rms_norm_eps;
    const int32_t *tokens = b->bat_step_device + BATCH_TOKENS;
    const int pdl = b->use_pdl ? 1 : 0;
    /* A negative token: that row's argmax of the previous batched step (overlapped decode, forward_batch). */
    DECODE_PART(CUDA_DECODE_PART_EMBED, cuda_embed(b->embed, tokens, b->bat_ids, b->bat_x, rows, hidden, st, 0));
    if (batch_gemm_rows(b, rows)) {
        /* Fused tensor-core kernels, chained by programmatic dependent launch (5 per layer, as B = 1). The
         * attention output and the SwiGLU product are kept as bf16 (o_proj and down round their input to bf16
         * anyway), so those two stage their input by cp.async in one round trip. */
        for (int l = 0; l < c->n_layers; l++) {
            const cuda_layer *L = &b->layers[l];
            DECODE_PART(CUDA_DECODE_PART_QKV, cuda_gemm_rows(L->qkv, b->bat_x, 0, L->input_norm, eps, b->bat_qkv, 0, rows,
                                                             qkv_dim, hidden, CUDA_GEMV_STORE, NULL, NULL, st, pdl));
            DECODE_PART(CUDA_DECODE_PART_ATTENTION, batch_attention(b, l, rows, b->bat_attention16, 1, pdl));
            DECODE_PART(CUDA_DECODE_PART_O, cuda_gemm_rows(L->o, b->bat_attention16, 1, NULL, 0.0f, b->bat_x, 0, rows,
                                                           hidden, qd, CUDA_GEMV_ADD_SETTLED, NULL, NULL, st, pdl));
            DECODE_PART(CUDA_DECODE_PART_GATE_UP, cuda_gemm_rows(L->gate_up, b->bat_x, 0, L->post_norm, eps, b->bat_act16,
                                                                 1, rows, 2 * inter, hidden, CUDA_GEMV_SWIGLU, NULL,
                                                                 NULL, st, pdl));
            DECODE_PART(CUDA_DECODE_PART_DOWN, cuda_gemm_rows(L->down, b->bat_act16, 1, NULL, 0.0f, b->bat_x, 0, rows,
                                                              hidden, inter, CUDA_GEMV_ADD_SETTLED, NULL, NULL, st, pdl));
        }
        DECODE_PART(CUDA_DECODE_PART_LM_HEAD, batch_lm_head(b, rows, pdl, false));
        return KITE_OK;
    }
    /* cuBLASLt GEMMs (M = rows), the same batched attention, SwiGLU on its own. Up to batch_split_max_rows rows
     * o_proj and down are split along k: their partials are added to the residual by the kernel that also takes
     * the next RMSNorm (of gate/up, of the next layer's qkv, of the lm_head), so only layer 0's input norm is a
     * kernel of its own and cuBLASLt launches no reduction. Otherwise o_proj and down add into the residual
     * (beta = 1) and each norm is a separate kernel. */
    const bool split = b->batch_split > 1 && rows <= b->batch_split_max_rows;
    const int S = b->batch_split;
    if (split)
        DECODE_PART(CUDA_DECODE_PART_QKV, cuda_rmsnorm(b->bat_x, b->layers[0].input_norm, b->bat_normed, NULL, rows,
                                                       hidden, eps, st));
    for (int l = 0; l < c->n_layers; l++) {
        const cuda_layer *L = &b->layers[l];
        const float *next_norm = l + 1 < c->n_layers ? b->layers[l + 1].input_norm : b->final_norm;
        DECODE_PART(CUDA_DECODE_PART_QKV, [&]() -> kite_status {
            if (!split) KITE_TRY(cuda_rmsnorm(b->bat_x, L->input_norm, b->bat_normed, NULL, rows, hidden, eps, st));
            return cuda_gemm_bf16(b->gemm, b->bat_normed, L->qkv, b->bat_qkv, 1, 0.0f, rows, qkv_dim, hidden, st);
        }());
        DECODE_PART(CUDA_DECODE_PART_ATTENTION, batch_attention(b, l, rows, b->bat_attention16, 1, pdl));
        DECODE_PART(CUDA_DECODE_PART_O, [&]() -> kite_status {
            if (!split) return cuda_gemm_bf16(b->gemm, b->bat_attention16, L->o, b->bat_x, 1, 1.0f, rows, hidden, qd, st);
            KITE_TRY(cuda_gemm_bf16_split(b->gemm, b->bat_attention16, L->o, b->bat_partials, S, rows, hidden, qd, st));
            return cuda_residual_rmsnorm(b->bat_x, b->bat_partials, S, L->post_norm, b->bat_normed, rows, hidden, eps, st);
        }());
        DECODE_PART(CUDA_DECODE_PART_GATE_UP, [&]() -> kite_status {
            if (!split) KITE_TRY(cuda_rmsnorm(b->bat_x, L->post_norm, b->bat_normed, NULL, rows, hidden, eps, st));
            KITE_TRY(cuda_gemm_bf16(b->gemm, b->bat_normed, L->gate_up, b->bat_gate_up, 0, 0.0f, rows, 2 * inter,
                                    hidden, st));
            return cuda_swiglu(b->bat_gate_up, b->bat_act16, rows, inter, st);
        }());
        DECODE_PART(CUDA_DECODE_PART_DOWN, [&]() -> kite_status {
            if (!split) return cuda_gemm_bf16(b->gemm, b->bat_act16, L->down, b->bat_x, 1, 1.0f, rows, hidden, inter, st);
            KITE_TRY(cuda_gemm_bf16_split(b->gemm, b->bat_act16, L->down, b->bat_partials, S, rows, hidden, inter, st));
            return cuda_residual_rmsnorm(b->bat_x, b->bat_partials, S, next_norm, b->bat_normed, rows, hidden, eps, st);
        }());
    }
    DECODE_PART(CUDA_DECODE_PART_LM_HEAD, batch_lm_head(b, rows, pdl, split));
    return KITE_OK;
}
#undef DECODE_PART

kite_status capture_batch_graph(cuda_backend *b, int bucket) {
    CUDA_CHECK(cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal));
    kite_status status = batch_launches(b, BUCKETS[bucket]);
    cudaGraph_t graph = NULL;
    const cudaError_t end = cudaStreamEndCapture(b->stream, &graph);
    if (status != KITE_OK) {
        if (graph) cudaGraphDestroy(graph);
        return status;
    }
    if (end != cudaSuccess)
        return kite_fail(KITE_ERROR_BACKEND, "cuda: cudaStreamEndCapture(batch graph %d) failed: %s", BUCKETS[bucket],
                         cudaGetErrorName(end));
    const cudaError_t inst = cudaGraphInstantiate(&b->bat_graphs[bucket], graph, 0);
    cudaGraphDestroy(graph);
    if (inst != cudaSuccess) {
        b->bat_graphs[bucket] = NULL;
        return kite_fail(KITE_ERROR_BACKEND, "cuda: cudaGraphInstantiate(batch graph %d) failed: %s", BUCKETS[bucket],
                         cudaGetErrorName(inst));
    }
    return KITE_OK;
}

kite_status forward_batch(cuda_backend *b, const step_batch *batch, const int32_t *chained) {
    const int32_t n = batch->n_seqs, bs = b->kv_block_size;
    const int bucket = bucket_index(n);
    const int32_t rows = BUCKETS[bucket];
    size_t table_ints = 1; /* entry 0: the scratch block of the dummy rows */
    for (int32_t s = 0; s < n; s++) table_ints += (size_t)KITE_CEIL_DIV(batch->seq_context_len[s], bs);
    KITE_TRY(ensure_batch(b, rows));
    KITE_TRY(ensure_batch_step(b, table_ints));
    CUDA_CHECK(cudaEventSynchronize(b->bat_step_copied)); /* the previous step's copy has left the host buffer */
    int32_t *h = b->bat_step_host;
    int32_t *tables = h + BATCH_TABLES;
    tables[0] = b->kv_blocks; /* the scratch block past the engine's blocks (kv_reserve) */
    size_t at = 1;
    for (int32_t s = 0; s < rows; s++) {
        if (s < n) {
            const int32_t context = batch->seq_context_len[s], n_blocks = KITE_CEIL_DIV(context, bs);
            /* The graph's embedding reads bat_ids[s] for a negative id (overlapped decode after a batched step). */
            h[BATCH_TOKENS + s] = chained ? (chained == b->bat_ids ? -1 : 0) : batch->token_ids[s];
            h[BATCH_CONTEXT + s] = context;
            h[BATCH_TABLE_START + s] = (int32_t)at;
            memcpy(tables + at, batch->block_tables[s], (size_t)n_blocks * sizeof(int32_t));
            at += (size_t)n_blocks;
        } else {
            h[BATCH_TOKENS + s] = 0;
            h[BATCH_CONTEXT + s] = 1;
            h[BATCH_TABLE_START + s] = 0;
        }
    }
    CUDA_CHECK(cudaMemcpyAsync(b->bat_step_device, h, ((size_t)BATCH_TABLES + at) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, b->stream));
    CUDA_CHECK(cudaEventRecord(b->bat_step_copied, b->stream));
    if (chained && chained != b->bat_ids)
        CUDA_CHECK(cudaMemcpyAsync(b->bat_step_device + BATCH_TOKENS, chained, (size_t)n * sizeof(int32_t),
                                   cudaMemcpyDeviceToDevice, b->stream));
    if (b->use_graph && b->bat_graphs[bucket]) {
        CUDA_CHECK(cudaGraphLaunch(b->bat_graphs[bucket], b->stream));
    } else {
        /* The first step of a bucket runs eagerly (modules load, cuBLASLt plans and kernel attributes are
         * set outside any capture), then the graph is captured for the steps after it. */
        KITE_TRY(batch_launches(b, rows));
        if (b->use_graph) KITE_TRY(capture_batch_graph(b, bucket));
    }
    b->kept_logits = b->bat_logits;
    b->kept_rows = n;
    b->kept_decode = false;
    b->kept_published = b->bat_publish_host + (batch->seq_context_len[0] & 1) * rows;
    b->kept_batch = true;
    return KITE_OK;
}

/* ---- backend_ops ------------------------------------------------------------------------------------ */

void free_all(cuda_backend *b) {
    if (b->stream) cudaStreamSynchronize(b->stream);
    for (int i = 0; i < N_DECODE_ATTENTION; i++)
        if (b->graph[i]) cudaGraphExecDestroy(b->graph[i]);
    cuda_gemm_destroy(b->gemm);
    cudaFree(b->weight_bytes);
    free(b->layers);
    cudaFree(b->rope_cos);
    cudaFree(b->rope_sin);
    cudaFree(b->kv_cache);
    cudaFree(b->activation_bytes);
    cudaFreeHost(b->meta_host);
    cudaFree(b->meta_device);
    cudaFree(b->logits);
    cudaFree(b->ids_device);
    cudaFreeHost(b->ids_host);
    cudaFree(b->top_device);
    cudaFreeHost(b->top_host);
    cudaFree(b->dec_x);
    cudaFree(b->persistent_layers);
    cudaFree(b->persistent.workspace);
    for (int i = 0; i < N_BUCKETS; i++)
        if (b->bat_graphs[i]) cudaGraphExecDestroy(b->bat_graphs[i]);
    cudaFree(b->bat_bytes);
    cudaFree(b->bat_step_device);
    cudaFreeHost(b->bat_step_host);
    if (b->bat_step_copied) cudaEventDestroy(b->bat_step_copied);
    cudaFree(b->step_device);
    cudaFreeHost(b->step_host);
    if (b->meta_copied) cudaEventDestroy(b->meta_copied);
    if (b->step_copied) cudaEventDestroy(b->step_copied);
    cudaFreeHost(b->publish_host);
    cudaFreeHost(b->bat_publish_host);
    for (int i = 0; i < BACKEND_ARGMAX_PENDING; i++) {
        cudaFreeHost(b->begun_host[i]);
        if (b->begun_copied[i]) cudaEventDestroy(b->begun_copied[i]);
    }
    if (b->stream) cudaStreamDestroy(b->stream);
    free(b);
}

void cuda_destroy(backend *self) {
    if (self) free_all(as_cuda(self));
}

kite_status cuda_kv_reserve(backend *self, int32_t n_blocks, int32_t block_size) {
    cuda_backend *b = as_cuda(self);
    const qwen3_config *c = &b->config;
    if (n_blocks <= 0 || block_size <= 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: kv_reserve(%d blocks, block size %d)", n_blocks, block_size);
    CUDA_CHECK(cudaSetDevice(b->device));
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    KITE_TRY(destroy_decode_graphs(b));
    KITE_TRY(destroy_batch_graphs(b));
    if (b->kv_cache) CUDA_CHECK(cudaFree(b->kv_cache));
    b->kv_cache = NULL;
    b->kv_blocks = b->kv_block_size = 0;
    /* One block more than asked: the scratch block where the batched path's dummy rows write. */
    const size_t layer_elements =
        ((size_t)n_blocks + 1) * 2 * (size_t)c->n_kv_heads * (size_t)block_size * (size_t)c->head_dim;
    const size_t bytes = layer_elements * (size_t)c->n_layers * sizeof(bf16);
    const cudaError_t e = cudaMalloc(&b->kv_cache, bytes);
    if (e != cudaSuccess) {
        b->kv_cache = NULL;
        cudaGetLastError();
        return kite_fail(e == cudaErrorMemoryAllocation ? KITE_ERROR_OUT_OF_MEMORY : KITE_ERROR_BACKEND,
                         "cuda backend: KV cache of %d blocks x %d positions (%zu bytes): cudaMalloc failed: %s",
                         n_blocks, block_size, bytes, cudaGetErrorName(e));
    }
    const size_t step_bytes = (size_t)(STEP_TABLE + n_blocks) * sizeof(int32_t);
    KITE_TRY(replace_device_and_pinned(&b->step_device, step_bytes, &b->step_host, step_bytes));
    b->kv_layer_elements = layer_elements;
    b->kv_blocks = n_blocks;
    b->kv_block_size = block_size;
    return KITE_OK;
}

kite_status validate_batch(const cuda_backend *b, const step_batch *batch) {
    const qwen3_config *c = &b->config;
    if (!b->kv_cache) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: forward before kv_reserve");
    if (!batch || batch->n_seqs <= 0 || batch->n_tokens <= 0 || (!batch->token_ids && !batch->tokens_from_argmax) ||
        !batch->seq_token_start || !batch->seq_context_len || !batch->block_tables || !batch->seq_wants_logits)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: empty or incomplete step batch");
    if (batch->tokens_from_argmax) {
        bool all_want = batch->n_tokens == batch->n_seqs;
        for (int32_t s = 0; s < batch->n_seqs; s++) all_want &= batch->seq_wants_logits[s] != 0;
        if (!all_want || b->kept_rows != batch->n_seqs)
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                             "cuda backend: tokens from the argmax need one token and a logits row per sequence (%d "
                             "sequences, %d tokens) and as many kept rows (%d)",
                             batch->n_seqs, batch->n_tokens, b->kept_rows);
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
        if (context > b->rope_positions || (int64_t)context > (int64_t)b->kv_blocks * b->kv_block_size)
            return kite_fail(KITE_ERROR_CAPACITY, "cuda backend: sequence %d context %d exceeds %d positions", s, context,
                             b->rope_positions);
        const int32_t n_blocks = KITE_CEIL_DIV(context, b->kv_block_size);
        for (int32_t i = 0; i < n_blocks; i++)
            if (batch->block_tables[s][i] < 0 || batch->block_tables[s][i] >= b->kv_blocks)
                return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: sequence %d block %d is %d, outside [0, %d)",
                                 s, i, batch->block_tables[s][i], b->kv_blocks);
    }
    return KITE_OK;
}

/* The device ids of the kept rows' argmax: where the decode graphs left them, else computed into ids_device. */
kite_status kept_argmax_device(cuda_backend *b, int32_t n_rows, const int32_t **ids) {
    if (b->kept_decode) {
        *ids = b->dec_token;
    } else if (b->kept_batch) {
        *ids = b->bat_ids;
    } else {
        KITE_TRY(ensure_logits(b, n_rows));
        KITE_TRY(cuda_argmax_rows(b->kept_logits, b->ids_device, n_rows, b->config.vocab_size, b->stream));
        *ids = b->ids_device;
    }
    return KITE_OK;
}

kite_status cuda_forward(backend *self, const step_batch *batch) {
    cuda_backend *b = as_cuda(self);
    KITE_TRY(validate_batch(b, batch));
    const int32_t *chained = NULL; /* tokens_from_argmax: the kept rows' argmax, before this step replaces them */
    if (batch->tokens_from_argmax) KITE_TRY(kept_argmax_device(b, batch->n_seqs, &chained));
    if (batch->n_seqs == 1 && batch->n_tokens == 1 && batch->seq_wants_logits[0]) {
        nvtx_scope range("kite decode step");
        return forward_decode(b, batch, chained);
    }
    if (b->use_batch && batch->n_seqs > 1 && batch->n_seqs <= BATCH_MAX && batch->n_tokens == batch->n_seqs) {
        bool all_want = true; /* one new token each (validated: at least one each), all wanting logits */
        for (int32_t s = 0; s < batch->n_seqs; s++) all_want &= batch->seq_wants_logits[s] != 0;
        if (all_want) {
            nvtx_scope range("kite batched decode step");
            return forward_batch(b, batch, chained);
        }
    }
    nvtx_scope range("kite forward (prefill or mixed)");
    return forward_general(b, batch, chained);
}

kite_status cuda_read_logits(backend *self, float *out, int32_t n_rows) {
    nvtx_scope range("kite read logits");
    cuda_backend *b = as_cuda(self);
    if (n_rows < 0 || n_rows > b->kept_rows)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: %d logits rows asked, %d kept", n_rows, b->kept_rows);
    if (n_rows == 0) return KITE_OK;
    CUDA_CHECK(cudaMemcpyAsync(out, b->kept_logits, (size_t)n_rows * (size_t)b->config.vocab_size * sizeof(float),
                               cudaMemcpyDeviceToHost, b->stream));
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    return KITE_OK;
}

static_assert(sizeof(cuda_row_top) == sizeof(backend_row_top) && CUDA_TOP_MAX == BACKEND_TOP_MAX,
              "cuda_row_top is backend_row_top");

/* read_top's buffers for `rows` rows: on the device its copied part - candidates (logits, ids) at BACKEND_TOP_MAX
 * per row, then the stats - followed by the workspace of cuda_top_candidates; the copied part pinned on the host. */
size_t top_copied_bytes(int32_t rows) {
    return align_up((size_t)rows * (BACKEND_TOP_MAX * (sizeof(float) + sizeof(int32_t)) + sizeof(backend_row_top)), 256);
}

kite_status ensure_top(cuda_backend *b, int32_t rows) {
    if (rows <= b->top_rows) return KITE_OK;
    const int32_t capacity = grown_capacity(b->top_rows, (int32_t)8, rows);
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    b->top_rows = 0;
    KITE_TRY(replace_device_and_pinned(
        &b->top_device, top_copied_bytes(capacity) + cuda_top_candidates_workspace(capacity, b->config.vocab_size),
        &b->top_host, top_copied_bytes(capacity)));
    b->top_rows = capacity;
    return KITE_OK;
}

kite_status cuda_read_top(backend *self, int32_t n_rows, int32_t k, float *top_logits, int32_t *top_ids,
                          backend_row_top *stats) {
    nvtx_scope range("kite read top candidates");
    cuda_backend *b = as_cuda(self);
    if (n_rows < 0 || n_rows > b->kept_rows || k <= 0 || k > BACKEND_TOP_MAX)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: read_top of %d rows (%d kept), k %d (at most %d)",
                         n_rows, b->kept_rows, k, BACKEND_TOP_MAX);
    if (n_rows == 0) return KITE_OK;
    const int vocab = b->config.vocab_size;
    if (!cuda_top_candidates_fits(vocab, k)) { /* not ranked here: the caller reads the rows whole */
        for (int32_t r = 0; r < n_rows; r++) stats[r] = backend_row_top{-INFINITY, 0, -1, -1, 0.0};
        return KITE_OK;
    }
    KITE_TRY(ensure_top(b, n_rows));
    /* [n_rows][k] logits, then [n_rows][k] ids, then the stats: one copy back. */
    const size_t candidates = (size_t)n_rows * (size_t)k;
    const size_t ids_at = candidates * sizeof(float), stats_at = ids_at + candidates * sizeof(int32_t);
    const size_t bytes = stats_at + (size_t)n_rows * sizeof(cuda_row_top);
    unsigned char *device = static_cast<unsigned char *>(b->top_device);
    KITE_TRY(cuda_top_candidates(b->kept_logits, n_rows, vocab, k, reinterpret_cast<float *>(device),
                                 reinterpret_cast<int32_t *>(device + ids_at), reinterpret_cast<cuda_row_top *>(device + stats_at),
                                 device + top_copied_bytes(b->top_rows), b->stream));
    CUDA_CHECK(cudaMemcpyAsync(b->top_host, b->top_device, bytes, cudaMemcpyDeviceToHost, b->stream));
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    const unsigned char *host = static_cast<const unsigned char *>(b->top_host);
    memcpy(top_logits, host, candidates * sizeof(float));
    memcpy(top_ids, host + ids_at, candidates * sizeof(int32_t));
    memcpy(stats, host + stats_at, (size_t)n_rows * sizeof(backend_row_top));
    return KITE_OK;
}

kite_status cuda_argmax(backend *self, int32_t *out_ids, int32_t n_rows) {
    nvtx_scope range("kite argmax (wait for ids)");
    cuda_backend *b = as_cuda(self);
    if (n_rows < 0 || n_rows > b->kept_rows)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: argmax of %d rows asked, %d kept", n_rows, b->kept_rows);
    if (n_rows == 0) return KITE_OK;
    if (const volatile int32_t *mapped = b->kept_published) { /* the step wrote its ids to the host itself */
        CUDA_CHECK(cudaStreamSynchronize(b->stream));
        for (int32_t i = 0; i < n_rows; i++) out_ids[i] = mapped[i];
        return KITE_OK;
    }
    KITE_TRY(ensure_logits(b, n_rows)); /* ids_host */
    const int32_t *ids = NULL;
    KITE_TRY(kept_argmax_device(b, n_rows, &ids));
    CUDA_CHECK(cudaMemcpyAsync(b->ids_host, ids, (size_t)n_rows * sizeof(int32_t), cudaMemcpyDeviceToHost, b->stream));
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    memcpy(out_ids, b->ids_host, (size_t)n_rows * sizeof(int32_t));
    return KITE_OK;
}

kite_status cuda_argmax_begin(backend *self, int32_t n_rows) {
    cuda_backend *b = as_cuda(self);
    if (n_rows <= 0 || n_rows > b->kept_rows || b->n_begun - b->n_ended >= BACKEND_ARGMAX_PENDING)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: argmax_begin of %d rows (%d kept, %lld pending)",
                         n_rows, b->kept_rows, (long long)(b->n_begun - b->n_ended));
    const int slot = (int)(b->n_begun % BACKEND_ARGMAX_PENDING);
    b->begun_mapped[slot] = NULL;
    const volatile int32_t *mapped = b->kept_published;
    bool taken = false; /* a pending one reads the same host memory (the next step will overwrite it): copy */
    for (int64_t i = b->n_ended; i < b->n_begun && mapped; i++) {
        const int other = (int)(i % BACKEND_ARGMAX_PENDING);
        const volatile int32_t *p = b->begun_mapped[other];
        taken |= p && p < mapped + n_rows && mapped < p + b->begun_rows[other];
    }
    if (mapped && !taken) {
        CUDA_CHECK(cudaEventRecord(b->begun_copied[slot], b->stream));
        b->begun_mapped[slot] = mapped;
        b->begun_rows[slot] = n_rows;
        b->n_begun++;
        return KITE_OK;
    }
    if (n_rows > b->begun_capacity[slot]) { /* this slot's previous copy was waited for by argmax_end */
        if (b->begun_host[slot]) CUDA_CHECK(cudaFreeHost(b->begun_host[slot]));
        b->begun_host[slot] = NULL;
        b->begun_capacity[slot] = 0;
        const int32_t capacity = grown_capacity((int32_t)0, (int32_t)8, n_rows);
        CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void **>(&b->begun_host[slot]), (size_t)capacity * sizeof(int32_t),
                                 cudaHostAllocDefault));
        b->begun_capacity[slot] = capacity;
    }
    const int32_t *ids = NULL;
    KITE_TRY(kept_argmax_device(b, n_rows, &ids));
    CUDA_CHECK(cudaMemcpyAsync(b->begun_host[slot], ids, (size_t)n_rows * sizeof(int32_t), cudaMemcpyDeviceToHost,
                               b->stream));
    CUDA_CHECK(cudaEventRecord(b->begun_copied[slot], b->stream));
    b->begun_rows[slot] = n_rows;
    b->n_begun++;
    return KITE_OK;
}

kite_status cuda_argmax_end(backend *self, int32_t *out_ids, int32_t n_rows) {
    cuda_backend *b = as_cuda(self);
    const int slot = (int)(b->n_ended % BACKEND_ARGMAX_PENDING);
    if (b->n_ended == b->n_begun || n_rows != b->begun_rows[slot] || !out_ids)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: argmax_end of %d rows: %s", n_rows,
                         b->n_ended == b->n_begun ? "none begun" : "not the rows begun");
    {
        nvtx_scope range("kite wait for token ids");
        CUDA_CHECK(cudaEventSynchronize(b->begun_copied[slot]));
    }
    if (b->begun_mapped[slot])
        for (int32_t i = 0; i < n_rows; i++) out_ids[i] = b->begun_mapped[slot][i];
    else
        memcpy(out_ids, b->begun_host[slot], (size_t)n_rows * sizeof(int32_t));
    b->n_ended++;
    return KITE_OK;
}

kite_status cuda_memory_info(backend *self, size_t *free_bytes, size_t *total_bytes) {
    cuda_backend *b = as_cuda(self);
    CUDA_CHECK(cudaSetDevice(b->device));
    CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
    return KITE_OK;
}

const char *cuda_device_name(backend *self) { return as_cuda(self)->device_name; }

/* E.g. "single stream: graph+pdl; attention: bulk-fed cluster of 8 up to 2048, cp.async cluster of 16 up to
 * 6144, split-K beyond; batched: gemm_rows up to 8 rows, cuBLASLt beyond; attention: bulk-fed clusters up to 32
 * rows, split-K beyond". Written when asked, from the settings in effect then (env switches at creation, the
 * bench's setters since). */
const char *cuda_decode_path(backend *self) {
    cuda_backend *b = as_cuda(self);
    char single[320], batched[288];
    if (b->use_persistent) {
        snprintf(single, sizeof single, "persistent kernel");
    } else {
        char attention[224] = "";
        size_t at = 0;
        if (b->attention_bulk > 0 && b->bulk_max_context > 0)
            at += (size_t)snprintf(attention + at, sizeof attention - at, "bulk-fed cluster of %d up to %d, ",
                                   b->attention_bulk, (int)b->bulk_max_context);
        if (b->attention_cluster > 0 && b->cluster_max_context > b->bulk_max_context && at < sizeof attention)
            at += (size_t)snprintf(attention + at, sizeof attention - at, "cp.async cluster of %d up to %d, ",
                                   b->attention_cluster, (int)b->cluster_max_context);
        if (at < sizeof attention) snprintf(attention + at, sizeof attention - at, "split-K beyond");
        snprintf(single, sizeof single, "%s; attention: %s",
                 b->use_graph ? (b->use_pdl ? "graph+pdl" : "graph") : (b->use_pdl ? "pdl, no graph" : "no graph"),
                 attention);
    }
    if (b->use_batch)
        snprintf(batched, sizeof batched,
                 "gemm_rows up to %d rows (lm_head up to %d), cuBLASLt beyond (o_proj/down in %d k slices up to %d "
                 "rows); attention: bulk-fed clusters up to %d rows, split-K beyond",
                 b->rows_max, b->batch_lm_head_rows_max, b->batch_split,
                 b->batch_split > 1 ? b->batch_split_max_rows : 0,
                 b->batch_bulk_max_rows);
    else
        snprintf(batched, sizeof batched, "off (general path)");
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

bool env_flag(const char *name, bool fallback) {
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    return strcmp(v, "0") != 0;
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
    const int device = params ? params->device : 0;
    KITE_TRY(check_device(device, NULL, 0));
    const qwen3_config *c = config;
    if (c->head_dim != 128)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda backend: head_dim %d (only 128 is implemented)", c->head_dim);
    if (c->hidden_size % 8 != 0 || c->intermediate_size % 8 != 0 || c->n_kv_heads <= 0 ||
        c->n_heads % c->n_kv_heads != 0 || c->vocab_size <= 0 || c->n_layers <= 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda backend: unsupported shape (hidden %d, intermediate %d, heads %d/%d)",
                         c->hidden_size, c->intermediate_size, c->n_heads, c->n_kv_heads);
    CUDA_CHECK(cudaSetDevice(device));

    cuda_backend *b = static_cast<cuda_backend *>(calloc(1, sizeof(cuda_backend)));
    if (!b) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cuda backend: out of host memory");
    b->config = *config;
    b->base.ops = &cuda_ops;
    b->base.config = &b->config;
    b->device = device;
    b->use_graph = env_flag("KITE_CUDA_GRAPH", true);
    b->use_pdl = env_flag("KITE_CUDA_PDL", true);
    b->use_batch = env_flag("KITE_CUDA_BATCH", true);
    /* Off by default: exact but measured slower than the graph path at short context (docs/notes-cuda.md,
     * "Persistent decode"). */
    b->use_persistent = env_flag("KITE_CUDA_PERSISTENT", false);
    b->rows_max = 8; /* measured: 16 rows run faster through cuBLASLt (docs/notes-cuda.md) */
    if (getenv("KITE_CUDA_ROWS_MAX")) b->rows_max = atoi(getenv("KITE_CUDA_ROWS_MAX"));
    if (b->rows_max > 32) b->rows_max = 32; /* cuda_gemm_rows takes at most 32 rows */
    /* Measured (session 5, per step against split-K): B=16 -7.3%, B=32 -5.5%, B=8 even; B=64 does not fit. */
    b->batch_bulk_max_rows = 32;
    if (getenv("KITE_CUDA_BATCH_BULK_MAX_ROWS")) b->batch_bulk_max_rows = atoi(getenv("KITE_CUDA_BATCH_BULK_MAX_ROWS"));
    /* Measured (session 6): B=16 -2.3% per step against cuBLASLt; at 32 rows, normalising fp32 rows per block,
     * gemm_rows was +1-2% slower. */
    b->batch_lm_head_rows_max = 16;
    if (getenv("KITE_CUDA_BATCH_LM_HEAD_ROWS"))
        b->batch_lm_head_rows_max = atoi(getenv("KITE_CUDA_BATCH_LM_HEAD_ROWS"));
    if (b->batch_lm_head_rows_max > 32) b->batch_lm_head_rows_max = 32; /* cuda_gemm_rows takes at most 32 rows */
    /* Measured per step against cuBLASLt's products and separate norms, 4 slices: B=16 -8.5%, B=32 -7.2% (session
     * 10, s10r8), B=64 -6.3%, B=128 -5.0% (s11r2), B=256 -0.8% (s11r3); 2 and 8 slices were slower at B=16-128
     * (s11r2). So every cuBLASLt bucket splits. A split that does not fit the shapes is not used. */
    b->batch_split = 4;
    b->batch_split_max_rows = BATCH_MAX;
    if (getenv("KITE_CUDA_BATCH_SPLIT")) b->batch_split = atoi(getenv("KITE_CUDA_BATCH_SPLIT"));
    if (getenv("KITE_CUDA_BATCH_SPLIT_MAX_ROWS")) b->batch_split_max_rows = atoi(getenv("KITE_CUDA_BATCH_SPLIT_MAX_ROWS"));
    if (!batch_split_fits(c, b->batch_split)) b->batch_split = 0;

    kite_status status = KITE_OK;
#define STEP(expr)                                                                                       \
    do {                                                                                                 \
        if (status == KITE_OK) status = (expr);                                                          \
    } while (0)
    auto cuda_step = [&](cudaError_t e, const char *what) -> kite_status {
        if (e == cudaSuccess) return KITE_OK;
        return kite_fail(KITE_ERROR_BACKEND, "cuda: %s failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
    };
    STEP(cuda_step(cudaDeviceGetAttribute(&b->sm_count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute"));
    cudaDeviceProp prop;
    STEP(cuda_step(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
    if (status == KITE_OK) snprintf(b->device_name, sizeof b->device_name, "%s", prop.name);
    STEP(cuda_step(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking), "cudaStreamCreate"));
    STEP(cuda_step(cudaEventCreateWithFlags(&b->meta_copied, cudaEventDisableTiming), "cudaEventCreate"));
    STEP(cuda_step(cudaEventCreateWithFlags(&b->step_copied, cudaEventDisableTiming), "cudaEventCreate"));
    STEP(cuda_step(cudaEventCreateWithFlags(&b->bat_step_copied, cudaEventDisableTiming), "cudaEventCreate"));
    for (int i = 0; i < BACKEND_ARGMAX_PENDING; i++)
        STEP(cuda_step(cudaEventCreateWithFlags(&b->begun_copied[i], cudaEventDisableTiming), "cudaEventCreate"));
    STEP(cuda_step(cudaHostAlloc(reinterpret_cast<void **>(&b->publish_host), 2 * sizeof(int32_t), cudaHostAllocMapped),
                   "cudaHostAlloc"));
    STEP(cuda_step(cudaHostGetDevicePointer(reinterpret_cast<void **>(&b->publish_device), b->publish_host, 0),
                   "cudaHostGetDevicePointer"));
    STEP(cuda_step(cudaHostAlloc(reinterpret_cast<void **>(&b->bat_publish_host), 2 * BATCH_MAX * sizeof(int32_t),
                                 cudaHostAllocMapped),
                   "cudaHostAlloc"));
    STEP(cuda_step(cudaHostGetDevicePointer(reinterpret_cast<void **>(&b->bat_publish_device), b->bat_publish_host, 0),
                   "cudaHostGetDevicePointer"));
    STEP(cuda_gemm_create(&b->gemm));
    STEP(upload_weights(b, weights));
    STEP(upload_rope(b));

    /* Decode buffers: fixed for the life of the backend, so the captured graph stays valid. */
    const int group_heads = c->n_heads / c->n_kv_heads;
    b->head_groups = group_heads / decode_group_size(group_heads);
    /* One wave of split-K blocks, by the kernel's occupancy: 4 per SM at GROUP 2 (128 registers), 5 at GROUP 1 (91),
     * 2 at GROUP 4 (209; Qwen3-4B at depth 16,384: 3.74 ms per token with 33 splits against 3.92 with 66, s9r7). */
    STEP(cuda_attention_decode_blocks_per_sm(c->n_heads, c->n_kv_heads, &b->split_blocks_per_sm));
    int splits = batch_splits(b, 1);
    if (getenv("KITE_CUDA_SPLITS")) splits = atoi(getenv("KITE_CUDA_SPLITS"));
    b->n_splits = splits < 1 ? 1 : splits;
    const size_t A = 256;
    const size_t hidden = c->hidden_size, qkv_dim = (size_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    const size_t qd = (size_t)c->n_heads * c->head_dim, inter = c->intermediate_size, vocab = c->vocab_size;
    const size_t sizes[9] = {hidden * 4, qkv_dim * 4, qd * 4, qd * 4, inter * 4, vocab * 4,
                             cuda_attention_decode_workspace(c->n_heads, c->head_dim, b->n_splits),
                             cuda_gemv_argmax_workspace(c->vocab_size), (size_t)c->n_heads * 4 + 64};
    size_t total = 0;
    for (int i = 0; i < 9; i++) total += align_up(sizes[i], A);
    void *dec = NULL;
    STEP(cuda_step(cudaMalloc(&dec, total), "cudaMalloc(decode buffers)"));
    if (status == KITE_OK) {
        STEP(cuda_step(cudaMemset(dec, 0, total), "cudaMemset(decode buffers)"));
        unsigned char *p = static_cast<unsigned char *>(dec);
        void *parts[9];
        for (int i = 0; i < 9; i++) {
            parts[i] = p;
            p += align_up(sizes[i], A);
        }
        b->dec_x = static_cast<float *>(parts[0]);
        b->dec_qkv = static_cast<float *>(parts[1]);
        b->dec_q = static_cast<float *>(parts[2]);
        b->dec_attention = static_cast<float *>(parts[3]);
        b->dec_act = static_cast<float *>(parts[4]);
        b->dec_logits = static_cast<float *>(parts[5]);
        b->dec_attention_ws = parts[6];
        b->dec_argmax_ws = parts[7];
        b->dec_counters = static_cast<unsigned *>(parts[8]);
        b->dec_token = reinterpret_cast<int32_t *>(static_cast<unsigned char *>(parts[8]) + (size_t)c->n_heads * 4);
    }
    if (status == KITE_OK && env_flag("KITE_CUDA_ATTENTION_CLUSTER", true)) {
        const cuda_kv_layer shape = {NULL, 16, c->n_kv_heads, c->head_dim};
        b->attention_cluster = cuda_attention_decode_cluster_size(c->n_heads, shape);
        b->attention_bulk = cuda_attention_decode_bulk_size(c->n_heads, shape);
        for (int i = 0; i < N_BUCKETS; i++)
            b->bat_bulk_cluster[i] = cuda_attention_decode_bulk_rows_size(c->n_heads, shape, BUCKETS[i]);
        const char *size = getenv("KITE_CUDA_ATTENTION_CLUSTER_SIZE"); /* 8 or 16, for measurements */
        if (size && b->attention_cluster > 0) {
            const int asked = atoi(size);
            if (asked == 8 || asked == b->attention_cluster) b->attention_cluster = asked;
            else status = kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: KITE_CUDA_ATTENTION_CLUSTER_SIZE=%s (8, or %d on this device)",
                                    size, b->attention_cluster);
            if (b->attention_bulk > 0 && asked == 8) b->attention_bulk = 8;
        }
    }
    /* The bulk-fed cluster kernel up to depth 1,024, the split-K one beyond; the cp.async cluster kernel only where
     * KITE_CUDA_CLUSTER_MAX_CONTEXT asks for it. Since its tail and head work (sessions 11-12) the split-K kernel is
     * the faster one from 2,048 (0.6B, ms per step: 0.7275 vs 0.7828 at 2,048, s13r3; 0.7849 vs 0.8855 at 4,096,
     * s13r2) and even at 256 for 0.6B (0.6184 vs 0.6244), but at 256 it costs the 1.7B and 4B shapes 2.4% and 2.9%
     * (s13r3); at 1,024 the two are equal for 0.6B (0.6663 vs 0.6685, s13r2). */
    b->bulk_max_context = 1024;
    if (getenv("KITE_CUDA_BULK_MAX_CONTEXT")) b->bulk_max_context = atoi(getenv("KITE_CUDA_BULK_MAX_CONTEXT"));
    b->cluster_max_context = 0;
    if (getenv("KITE_CUDA_CLUSTER_MAX_CONTEXT")) b->cluster_max_context = atoi(getenv("KITE_CUDA_CLUSTER_MAX_CONTEXT"));
    if (status == KITE_OK && b->use_persistent) status = setup_persistent_decode(b);
    STEP(cuda_step(cudaDeviceSynchronize(), "cudaDeviceSynchronize(after upload)"));
#undef STEP
    if (status != KITE_OK) {
        free_all(b);
        return status;
    }
    *out = &b->base;
    return KITE_OK;
}

extern "C" kite_status cuda_backend_set_decode_options(backend *self, int use_graph, int use_pdl) {
    cuda_backend *b = as_cuda(self);
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    KITE_TRY(destroy_decode_graphs(b));
    KITE_TRY(destroy_batch_graphs(b));
    b->use_graph = use_graph != 0;
    b->use_pdl = use_pdl != 0;
    return KITE_OK;
}

extern "C" kite_status cuda_backend_set_cluster_max_context(backend *self, int32_t max_context) {
    as_cuda(self)->cluster_max_context = max_context; /* the graphs stay valid: forward picks one per step */
    return KITE_OK;
}

extern "C" int32_t cuda_backend_cluster_max_context(backend *self) { return as_cuda(self)->cluster_max_context; }

extern "C" kite_status cuda_backend_set_bulk_max_context(backend *self, int32_t max_context) {
    as_cuda(self)->bulk_max_context = max_context; /* the graphs stay valid: forward picks one per step */
    return KITE_OK;
}

extern "C" int32_t cuda_backend_bulk_max_context(backend *self) { return as_cuda(self)->bulk_max_context; }

extern "C" int cuda_backend_attention_bulk(backend *self) { return as_cuda(self)->attention_bulk; }

extern "C" kite_status cuda_backend_set_batch_bulk_max_rows(backend *self, int32_t max_rows) {
    cuda_backend *b = as_cuda(self);
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    KITE_TRY(destroy_batch_graphs(b)); /* each bucket's graph holds its attention kernel */
    b->batch_bulk_max_rows = max_rows;
    return KITE_OK;
}

extern "C" kite_status cuda_backend_set_batch_split(backend *self, int slices, int32_t max_rows) {
    cuda_backend *b = as_cuda(self);
    if (slices > 1 && !batch_split_fits(&b->config, slices))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: %d slices do not divide o_proj and down", slices);
    KITE_TRY(release_batch(b)); /* ensure_batch allocates again, with the partials */
    b->batch_split = slices > 1 ? slices : 0;
    b->batch_split_max_rows = max_rows;
    return KITE_OK;
}

extern "C" const char *cuda_backend_cluster_report(backend *self, char *buffer, size_t capacity) {
    const cuda_backend *b = as_cuda(self);
    const qwen3_config *c = &b->config;
    const cuda_kv_layer shape = {NULL, 16, c->n_kv_heads, c->head_dim};
    const int needed = c->n_kv_heads * b->head_groups;
    size_t at = (size_t)snprintf(buffer, capacity, "cluster capacity (%d clusters needed; size: clusters, blocks per SM):",
                                 needed);
    for (int kind = 0; kind < 3 && at < capacity; kind++) {
        const char *name = kind == 0 ? "cp.async" : kind == 1 ? "bulk" : "bulk batched";
        at += (size_t)snprintf(buffer + at, capacity - at, " %s", name);
        for (int size = 8; size <= 16 && at < capacity; size *= 2) {
            int clusters = 0, per_sm = 0;
            if (kind == 0) cuda_attention_decode_cluster_capacity(c->n_heads, shape, size, &clusters, &per_sm);
            else cuda_attention_decode_bulk_capacity(c->n_heads, shape, size, kind == 2, &clusters, &per_sm);
            at += (size_t)snprintf(buffer + at, capacity - at, " %d: %d, %d;", size, clusters, per_sm);
        }
    }
    return buffer;
}

extern "C" int32_t cuda_backend_batch_bulk_max_rows(backend *self) { return as_cuda(self)->batch_bulk_max_rows; }

extern "C" int cuda_backend_batch_bulk_cluster(backend *self, int32_t rows) {
    return batch_bulk_cluster(as_cuda(self), rows);
}

extern "C" int cuda_backend_attention_cluster(backend *self) { return as_cuda(self)->attention_cluster; }

extern "C" kite_status cuda_backend_set_decode_anatomy(backend *self, unsigned skip_parts, unsigned twice_parts) {
    cuda_backend *b = as_cuda(self);
    KITE_TRY(cuda_backend_set_decode_options(self, b->use_graph, b->use_pdl)); /* drops the captured graphs */
    b->anatomy_skip = skip_parts;
    b->anatomy_twice = twice_parts;
    return KITE_OK;
}

extern "C" kite_status cuda_backend_set_persistent_decode(backend *self, int on) {
    cuda_backend *b = as_cuda(self);
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    if (on && !b->persistent.workspace) KITE_TRY(setup_persistent_decode(b));
    b->use_persistent = on && b->persistent.workspace != NULL;
    return KITE_OK;
}

extern "C" int cuda_backend_persistent_decode(backend *self) { return as_cuda(self)->use_persistent ? 1 : 0; }

extern "C" kite_status cuda_backend_set_batched_decode(backend *self, int on) {
    cuda_backend *b = as_cuda(self);
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    b->use_batch = on != 0;
    return KITE_OK;
}

extern "C" kite_status cuda_backend_synchronize(backend *self) {
    CUDA_CHECK(cudaStreamSynchronize(as_cuda(self)->stream));
    return KITE_OK;
}

/* The cluster decode attention's parts apart from how K/V tiles reach shared memory (attention_decode_bulk.cu: by
 * bulk copies from a producer warp). It splits a kv head's positions over the CS blocks of a thread-block cluster.
 * Here: the per-block state that outlives the tile loop, the query / new-K/V preparation after the
 * PDL wait, the block's partial result, its combine by the cluster's rank 0 through distributed shared
 * memory, and the host-side launch (cluster dimension, PDL, the co-residency query).
 * Grid (CS, kv heads, sequences x head groups): a cluster serves one (sequence, kv head, head group). Single
 * stream: one sequence, CS = 8 or 16. Batched decode: B sequences, each with its own context length and block
 * table, CS = 1 .. 16 chosen so that all clusters are resident at once. */
#ifndef KITE_BACKEND_CUDA_DECODE_CLUSTER_CUH
#define KITE_BACKEND_CUDA_DECODE_CLUSTER_CUH

#include "backend/cuda/kernels/decode_attention.cuh"

#include <cooperative_groups.h>

/* What a block keeps beside its K/V stages. */
template <int GROUP>
struct decode_cluster_state {
    float q[GROUP][DECODE_HEAD_DIM];        /* normalised, rotated, scaled by log2(e) / sqrt(head_dim) */
    bf16 new_kv[2][DECODE_HEAD_DIM];        /* the new position's K (normalised, rotated) and V, as cached */
    float part_acc[GROUP][DECODE_HEAD_DIM]; /* this block's partial result, read by the cluster's rank 0 */
    float part_m[GROUP], part_l[GROUP];
};

/* The (sequence, kv head, head group) a block's cluster serves: blockIdx.y is the kv head, blockIdx.z the
 * sequence * head groups + head group. Sequence s reads its QKV row s, writes its output row s and takes its
 * block table at block_tables + table_start[s] (table_start NULL: one sequence, offset 0). */
template <typename OutT>
struct decode_cluster_target {
    const float *qkv;           /* this sequence's QKV row: query heads, then K heads, then V heads */
    OutT *out;                  /* its attention output row */
    const int32_t *block_table; /* its block table */
    int ctx;                    /* its context length, the new position included */
    int kv_head, first_head;
    bool head_group_0; /* the group that appends the new K/V (one writer) */
};

template <int GROUP, typename OutT>
__device__ __forceinline__ decode_cluster_target<OutT> locate_cluster_target(const float *qkv_rows, OutT *out_rows,
                                                                            const cuda_kv_layer &kv,
                                                                            const int32_t *block_tables,
                                                                            const int32_t *table_start,
                                                                            const int32_t *context_lens, int n_heads) {
    const int group_heads = n_heads / kv.n_kv_heads, head_groups = group_heads / GROUP;
    const int seq = (int)blockIdx.z / head_groups, head_group = (int)blockIdx.z % head_groups;
    decode_cluster_target<OutT> t;
    t.qkv = qkv_rows + (size_t)seq * (size_t)(n_heads + 2 * kv.n_kv_heads) * DECODE_HEAD_DIM;
    t.out = out_rows + (size_t)seq * (size_t)n_heads * DECODE_HEAD_DIM;
    t.block_table = block_tables + (table_start ? table_start[seq] : 0);
    t.ctx = context_lens[seq]; /* the step's lengths and tables were copied before the graph ran */
    t.kv_head = (int)blockIdx.y;
    t.first_head = t.kv_head * group_heads + head_group * GROUP;
    t.head_group_0 = head_group == 0;
    return t;
}

/* A lane's Q/K norm weights and RoPE angles for the new position (dims 2l, 2l + 1, 64 + 2l, 65 + 2l): they do
 * not depend on the previous kernel, so they are loaded before the PDL wait. */
struct decode_rope_lane {
    int d0, d1;
    float qw[4], kw[4];
    float2 rc, rs;
};

__device__ __forceinline__ decode_rope_lane load_rope_lane(const float *__restrict__ q_norm,
                                                           const float *__restrict__ k_norm,
                                                           const float *__restrict__ rope_cos,
                                                           const float *__restrict__ rope_sin, int position, int lane) {
    decode_rope_lane r;
    r.d0 = 2 * lane;
    r.d1 = DECODE_HEAD_DIM / 2 + 2 * lane;
    r.qw[0] = q_norm[r.d0], r.qw[1] = q_norm[r.d0 + 1], r.qw[2] = q_norm[r.d1], r.qw[3] = q_norm[r.d1 + 1];
    r.kw[0] = k_norm[r.d0], r.kw[1] = k_norm[r.d0 + 1], r.kw[2] = k_norm[r.d1], r.kw[3] = k_norm[r.d1 + 1];
    r.rc = *reinterpret_cast<const float2 *>(rope_cos + (size_t)position * (DECODE_HEAD_DIM / 2) + r.d0);
    r.rs = *reinterpret_cast<const float2 *>(rope_sin + (size_t)position * (DECODE_HEAD_DIM / 2) + r.d0);
    return r;
}

/* After the PDL wait, warps warp, warp + n_warps, ... of the block: the GROUP query heads into st.q, and in the
 * block that owns the new position its K and V into st.new_kv (for this block's own use) and, in head group 0
 * only (one writer), appended to the cache. qkv holds the query heads, then the K heads, then the V heads. */
template <int GROUP>
__device__ __forceinline__ void prepare_query_and_new_kv(decode_cluster_state<GROUP> &st, const decode_rope_lane &r,
                                                         const float *qkv, const cuda_kv_layer &kv,
                                                         const int32_t *block_table, int position, bool owns_new,
                                                         bool head_group_0, int n_heads, int first_head, int kv_head,
                                                         float eps, float scale_log2, int warp, int n_warps) {
    for (int item = warp; item < GROUP + 2; item += n_warps) {
        if (item < GROUP) {
            const float *src = qkv + (size_t)(first_head + item) * DECODE_HEAD_DIM;
            float v[4];
            norm_rope_lane(*reinterpret_cast<const float2 *>(src + r.d0), *reinterpret_cast<const float2 *>(src + r.d1),
                           r.qw, r.rc, r.rs, eps, v);
            st.q[item][r.d0] = v[0] * scale_log2;
            st.q[item][r.d0 + 1] = v[1] * scale_log2;
            st.q[item][r.d1] = v[2] * scale_log2;
            st.q[item][r.d1 + 1] = v[3] * scale_log2;
        } else if (owns_new) {
            const int kind = item - GROUP; /* 0: K, 1: V */
            const float *src = qkv + ((size_t)n_heads + (size_t)(kind * kv.n_kv_heads + kv_head)) * DECODE_HEAD_DIM;
            const float2 lo = *reinterpret_cast<const float2 *>(src + r.d0);
            const float2 hi = *reinterpret_cast<const float2 *>(src + r.d1);
            float v[4] = {lo.x, lo.y, hi.x, hi.y};
            if (kind == 0) norm_rope_lane(lo, hi, r.kw, r.rc, r.rs, eps, v);
            const uint32_t a = pack_bf16x2(v[0], v[1]), b = pack_bf16x2(v[2], v[3]);
            *reinterpret_cast<uint32_t *>(&st.new_kv[kind][r.d0]) = a;
            *reinterpret_cast<uint32_t *>(&st.new_kv[kind][r.d1]) = b;
            if (head_group_0) {
                const int32_t block = block_table[position / kv.block_size], slot = position % kv.block_size;
                bf16 *dst = static_cast<bf16 *>(kv.base) + kv_offset(kv, block, kind, kv_head, slot);
                *reinterpret_cast<uint32_t *>(dst + r.d0) = a;
                *reinterpret_cast<uint32_t *>(dst + r.d1) = b;
            }
        }
    }
}

/* A stream's query values for its lanes' dims (stream_dim order) from st.q, and its empty softmax state. */
template <int GROUP>
__device__ __forceinline__ void stream_start(const decode_cluster_state<GROUP> &st, int sub, float qr[GROUP][16],
                                             float m[GROUP], float l[GROUP], float acc[GROUP][16]) {
#pragma unroll
    for (int g = 0; g < GROUP; g++)
#pragma unroll
        for (int i = 0; i < 16; i++) qr[g][i] = st.q[g][stream_dim(sub, i)];
    stream_init<GROUP>(m, l, acc);
}

/* Folds position p of a tile staged in shared memory into a stream: `rows` holds the tile's TILE K rows, then its
 * TILE V rows, the stream's at slot `stream`; the new position's K and V come from st.new_kv instead. Every stream
 * computes its score, also past the range end (stale shared memory, discarded), so the shuffles see whole warps. */
template <int GROUP, int TILE>
__device__ __forceinline__ void stream_add_staged(const decode_cluster_state<GROUP> &st, const unsigned char *rows,
                                                  int stream, int sub, int p, int position, int end,
                                                  const float qr[GROUP][16], float m[GROUP], float l[GROUP],
                                                  float acc[GROUP][16]) {
    constexpr int ROW_BYTES = DECODE_HEAD_DIM * 2;
    const uint4 *k_row = p == position ? reinterpret_cast<const uint4 *>(st.new_kv[0])
                                       : reinterpret_cast<const uint4 *>(rows + stream * ROW_BYTES);
    const uint4 *v_row = p == position ? reinterpret_cast<const uint4 *>(st.new_kv[1])
                                       : reinterpret_cast<const uint4 *>(rows + (TILE + stream) * ROW_BYTES);
    float kf[16], vf[16];
    bf16x8_to_float(k_row[sub], kf);
    bf16x8_to_float(k_row[sub + 8], kf + 8);
    float s[GROUP];
    stream_scores<GROUP>(qr, kf, s);
    if (p < end) {
        bf16x8_to_float(v_row[sub], vf);
        bf16x8_to_float(v_row[sub + 8], vf + 8);
        online_softmax_add<GROUP>(m, l, acc, s, vf);
    }
}

/* The block's partial result (its warps' results merged, in ms) into st.part_*, by threads
 * thread, thread + n_threads, ... */
template <int GROUP, int WARPS>
__device__ __forceinline__ void store_block_partial(decode_cluster_state<GROUP> &st,
                                                    const warp_partials<WARPS, GROUP> &ms, int thread, int n_threads) {
    for (int item = thread; item < GROUP * DECODE_HEAD_DIM; item += n_threads) {
        const int g = item / DECODE_HEAD_DIM, d = item % DECODE_HEAD_DIM;
        float m_all, l_all, a_all;
        ms.merge(g, d, m_all, l_all, a_all);
        st.part_acc[g][d] = a_all;
        if (d == 0) {
            st.part_m[g] = m_all;
            st.part_l[g] = l_all;
        }
    }
}

/* A cluster of one block: its warps' results merged (in ms) are the output, written by threads thread,
 * thread + n_threads, ... - what combine_cluster_partials would compute from this block's partial alone (a factor
 * exp2(0) = 1), without the partial's round trip through shared memory and the two cluster barriers. */
template <int GROUP, int WARPS, typename OutT>
__device__ __forceinline__ void store_block_out(const warp_partials<WARPS, GROUP> &ms, OutT *out, int first_head,
                                                int thread, int n_threads) {
    for (int item = thread; item < GROUP * DECODE_HEAD_DIM; item += n_threads) {
        const int g = item / DECODE_HEAD_DIM, d = item % DECODE_HEAD_DIM;
        float m_all, l_all, a_all;
        ms.merge(g, d, m_all, l_all, a_all);
        store_decode_out(&out[(size_t)(first_head + g) * DECODE_HEAD_DIM + d], a_all / l_all);
    }
}

/* Every block of the cluster calls it after store_block_partial: rank 0 combines the blocks' partials (read
 * through distributed shared memory) into out, by threads thread, thread + n_threads, ... */
template <int GROUP, typename OutT>
__device__ __forceinline__ void combine_cluster_partials(decode_cluster_state<GROUP> &st, OutT *out, int first_head,
                                                         int thread, int n_threads) {
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    const int n_ranks = (int)cluster.num_blocks();
    cluster.sync(); /* every block's partial is written (release / acquire across the cluster) */
    if (cluster.block_rank() == 0) {
        for (int item = thread; item < GROUP * DECODE_HEAD_DIM; item += n_threads) {
            const int g = item / DECODE_HEAD_DIM, d = item % DECODE_HEAD_DIM;
            float m_all = DECODE_NO_SCORE;
            for (int r = 0; r < n_ranks; r++) m_all = fmaxf(m_all, cluster.map_shared_rank(&st, r)->part_m[g]);
            float l_all = 0.0f, a_all = 0.0f;
            for (int r = 0; r < n_ranks; r++) {
                const decode_cluster_state<GROUP> *other = cluster.map_shared_rank(&st, r);
                const float f = exp2f(other->part_m[g] - m_all);
                l_all += other->part_l[g] * f;
                a_all += other->part_acc[g][d] * f;
            }
            store_decode_out(&out[(size_t)(first_head + g) * DECODE_HEAD_DIM + d], a_all / l_all);
        }
    }
    cluster.sync(); /* rank 0 is done reading the others' shared memory before they exit */
}

/* Grid (cluster_size, kv heads, sequences x head groups) of a cluster decode attention. */
static inline dim3 decode_cluster_grid(int cluster_size, int n_heads, const cuda_kv_layer &kv, int n_seqs) {
    const int group_heads = n_heads / kv.n_kv_heads;
    return dim3((unsigned)cluster_size, (unsigned)kv.n_kv_heads,
                (unsigned)(group_heads / decode_group_size(group_heads) * n_seqs));
}

/* What the device can hold of a cluster kernel at once: clusters of the asked size, and blocks per SM. */
struct decode_cluster_capacity {
    int clusters, blocks_per_sm;
};

/* Launches kernel over grid in clusters of cluster_size along x (PDL when asked); query not NULL: instead,
 * fills *query (nothing runs). */
template <typename... KernelArgs, typename... Args>
static inline cudaError_t launch_decode_cluster(void (*kernel)(KernelArgs...), size_t smem, unsigned threads,
                                                int cluster_size, dim3 grid, cudaStream_t stream, bool use_pdl,
                                                decode_cluster_capacity *query, Args... args) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess && cluster_size > 8) e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e != cudaSuccess) return e;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute attribute[2];
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = (unsigned)cluster_size;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    attribute[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[1].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = use_pdl ? 2 : 1;
    if (query) {
        e = cudaOccupancyMaxActiveClusters(&query->clusters, kernel, &config);
        if (e != cudaSuccess) return e;
        const cudaError_t per_sm =
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&query->blocks_per_sm, kernel, (int)threads, smem);
        if (per_sm != cudaSuccess) {
            (void)cudaGetLastError(); /* blocks per SM is a diagnostic: its failure does not refuse the size */
            query->blocks_per_sm = 0;
        }
        return cudaSuccess;
    }
    return cudaLaunchKernelEx(&config, kernel, static_cast<KernelArgs>(args)...);
}

/* The host side of a cluster decode attention, for a kernel family F with
 *   template <int GROUP, typename OutT> static <kernel pointer> kernel();   template <int GROUP> static size_t smem();
 *   static constexpr unsigned BLOCK_THREADS;   static constexpr const char *NAME;
 * whose kernels take (qkv_rows, out_rows, kv, block_tables, table_start, context_lens, q_norm, k_norm, rope_cos,
 * rope_sin, eps, n_heads, scale_log2). */
static inline bool decode_cluster_shape_supported(int n_heads, const cuda_kv_layer &kv) {
    return kv.head_dim == DECODE_HEAD_DIM && kv.n_kv_heads > 0 && n_heads % kv.n_kv_heads == 0;
}

template <typename F, typename OutT>
cudaError_t dispatch_decode_cluster(int cluster_size, int n_heads, const cuda_kv_layer &kv, int n_seqs,
                                    cudaStream_t stream, bool use_pdl, decode_cluster_capacity *query,
                                    const float *qkv, OutT *out,
                                    const int32_t *block_tables, const int32_t *table_start,
                                    const int32_t *context_lens, const float *q_norm, const float *k_norm,
                                    const float *rope_cos, const float *rope_sin, float eps, float scale_log2) {
    const dim3 grid = decode_cluster_grid(cluster_size, n_heads, kv, n_seqs);
#define KITE_DECODE_CLUSTER_LAUNCH(G)                                                                             \
    launch_decode_cluster(F::template kernel<G, OutT>(), F::template smem<G>(), F::BLOCK_THREADS, cluster_size, grid, \
                          stream, use_pdl, query, qkv, out, kv, block_tables, table_start, context_lens, q_norm,      \
                          k_norm, rope_cos, rope_sin, eps, n_heads, scale_log2)
    switch (decode_group_size(n_heads / kv.n_kv_heads)) {
    case 4: return KITE_DECODE_CLUSTER_LAUNCH(4);
    case 2: return KITE_DECODE_CLUSTER_LAUNCH(2);
    default: return KITE_DECODE_CLUSTER_LAUNCH(1);
    }
#undef KITE_DECODE_CLUSTER_LAUNCH
}

/* The largest cluster size from 16 down to smallest at which all of the grid's clusters for n_seqs sequences
 * can be resident at once; 0 where none can or the shape is not supported. */
template <typename F, typename OutT>
decode_cluster_capacity decode_cluster_query(int cluster_size, int n_heads, const cuda_kv_layer &kv, int n_seqs) {
    decode_cluster_capacity capacity = {0, 0};
    if (!decode_cluster_shape_supported(n_heads, kv) || n_seqs <= 0) return capacity;
    const cudaError_t e = dispatch_decode_cluster<F, OutT>(cluster_size, n_heads, kv, n_seqs, 0, true, &capacity, NULL,
                                                           NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0.0f, 0.0f);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* a refused size is an answer (none fit), not an error to keep */
        capacity.clusters = capacity.blocks_per_sm = 0;
    }
    return capacity;
}

template <typename F, typename OutT>
int decode_cluster_size(int n_heads, const cuda_kv_layer &kv, int n_seqs, int smallest) {
    if (!decode_cluster_shape_supported(n_heads, kv) || n_seqs <= 0) return 0;
    for (int size = 16; size >= smallest; size /= 2) {
        const dim3 grid = decode_cluster_grid(size, n_heads, kv, n_seqs);
        if (decode_cluster_query<F, OutT>(size, n_heads, kv, n_seqs).clusters >= (int)(grid.y * grid.z)) return size;
    }
    return 0;
}

/* One launch for n_seqs sequences (table_start NULL: one sequence, its table at block_tables). */
template <typename F, typename OutT>
kite_status run_decode_cluster(const float *qkv, OutT *out, const cuda_kv_layer &kv, const int32_t *block_tables,
                               const int32_t *table_start, const int32_t *context_lens, const float *q_norm,
                               const float *k_norm, const float *rope_cos, const float *rope_sin, float eps,
                               int n_heads, float scale, int n_seqs, int cluster_size, void *stream, int use_pdl) {
    const bool size_ok = cluster_size >= 1 && cluster_size <= 16 && (cluster_size & (cluster_size - 1)) == 0;
    if (!decode_cluster_shape_supported(n_heads, kv) || !size_ok || n_seqs <= 0 || (n_seqs > 1 && !table_start))
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: head_dim %d heads %d kv heads %d sequences %d cluster %d",
                         F::NAME, kv.head_dim, n_heads, kv.n_kv_heads, n_seqs, cluster_size);
    const cudaError_t e = dispatch_decode_cluster<F, OutT>(cluster_size, n_heads, kv, n_seqs,
                                                           static_cast<cudaStream_t>(stream), use_pdl != 0, NULL, qkv,
                                                           out, block_tables, table_start, context_lens, q_norm, k_norm,
                                                           rope_cos, rope_sin, eps, scale * 1.4426950408889634f);
    CUDA_CHECK(e);
    return KITE_OK;
}

#endif

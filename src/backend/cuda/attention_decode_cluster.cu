/* Single-stream decode attention with the split-K combine inside a thread-block cluster.
 *
 * The split-K kernel of attention_decode.cu combines its splits through global memory (partials, a fence,
 * an atomic counter, the last block reads them back): a chain of dependent round trips that costs more than
 * the attention itself at short context (docs/notes-cuda.md, "anatomy"). Here the splits of one kv head are
 * the CS blocks of one cluster (CS = 8 or 16, one block per SM): each block takes a contiguous range of
 * positions, streams its K/V rows through shared memory in tiles of TILE positions (cp.async, STAGES tiles in
 * flight), and the cluster combines the blocks' partial results through distributed shared memory.
 *
 * Cached positions do not depend on the previous kernel, so each block issues the copies of its first STAGES
 * tiles before waiting on it (PDL); at short context that is the block's whole range. After the wait the
 * block normalises and rotates its query heads (and, in the block that owns the new position, the new K
 * and appends K/V to the cache, keeping them in shared memory for its own use).
 *
 * Grid (CS, kv_heads, head_groups), decode_cluster.cuh; GROUP query heads per cluster share each K/V row they
 * read. Inside a block 32 streams of 8 lanes take one position of a tile each; lane j of a stream holds dims
 * stream_dim(j, 0 .. 15) (decode_attention.cuh). */
#include "backend/cuda/decode_cluster.cuh"

namespace {

constexpr int HEAD_DIM = DECODE_HEAD_DIM;
constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int TILE = THREADS / 8; /* positions per tile: one per stream */
/* Tiles in flight per block (16 KB each). Measured (docs/notes-cuda.md): 6 stages were slower at depth 256
 * (0.741 vs 0.684 ms per 0.6B token) and no faster at 16,384; 128 threads with 16 stages of 8 KB were twice as
 * slow at 16,384 (the loop is bound by its per-tile latency, so tiles must be wide). */
constexpr int STAGES = 4;
constexpr int ROW_BYTES = HEAD_DIM * 2;                   /* one K or V row, bf16 */
constexpr int TILE_BYTES = 2 * TILE * ROW_BYTES;          /* K rows then V rows */
constexpr int PIECES_PER_THREAD = TILE_BYTES / 16 / THREADS;


/* Shared memory of a block: the tile stages, then the values that outlive the loop. */
template <int GROUP>
struct cluster_smem {
    unsigned char stages[STAGES][TILE_BYTES];
    decode_cluster_state<GROUP> st;
};

template <int GROUP, typename OutT>
__global__ void __launch_bounds__(THREADS, 1)
    attention_decode_cluster_kernel(const float *qkv_rows, OutT *out_rows, cuda_kv_layer kv,
                                    const int32_t *block_tables, const int32_t *table_start,
                                    const int32_t *context_lens, const float *__restrict__ q_norm,
                                    const float *__restrict__ k_norm, const float *__restrict__ rope_cos,
                                    const float *__restrict__ rope_sin, float eps, int n_heads, float scale_log2) {
    using merge_scratch = warp_partials<WARPS, GROUP>; /* reuses the stages once the loop is done */
    static_assert(sizeof(merge_scratch) <= sizeof(((cluster_smem<GROUP> *)0)->stages), "merge scratch fits");
    /* 128-byte aligned for the stages' cp.async writes (scripts/kernel_footprint.sh says why every kernel declares it
     * so). */
    extern __shared__ __align__(128) unsigned char smem_raw[];
    cluster_smem<GROUP> &sm = *reinterpret_cast<cluster_smem<GROUP> *>(smem_raw);
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    const int rank = (int)cluster.block_rank(), n_ranks = (int)cluster.num_blocks();
    const decode_cluster_target<OutT> target =
        locate_cluster_target<GROUP>(qkv_rows, out_rows, kv, block_tables, table_start, context_lens, n_heads);
    const int kv_head = target.kv_head;
    const int32_t *block_table = target.block_table;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane & 7;
    const int stream = warp * 4 + (lane >> 3);
    const bf16 *cache = static_cast<const bf16 *>(kv.base);

    const int ctx = target.ctx, position = ctx - 1;
    const int chunk = (ctx + n_ranks - 1) / n_ranks;
    const int begin = min(ctx, rank * chunk), end = min(ctx, begin + chunk);
    const int n_tiles = (end - begin + TILE - 1) / TILE;

    /* Thread t copies PIECES_PER_THREAD 16-byte pieces of a tile: position t / 8 of the tile, K and V. Its
     * cache block comes from the block table one round ahead (table_block), so the table read never stalls
     * the loop. */
    const int slot_in_tile = threadIdx.x >> 3, piece = threadIdx.x & 7;
    auto table_block = [&](int tile) -> int32_t {
        const int p = begin + tile * TILE + slot_in_tile;
        return tile < n_tiles && p < end && p != position ? block_table[p / kv.block_size] : -1;
    };
    auto issue_tile = [&](int tile, int32_t block) {
        if (block >= 0) {
            const int p = begin + tile * TILE + slot_in_tile;
            const int32_t slot = p % kv.block_size;
            unsigned char *stage = sm.stages[tile % STAGES];
#pragma unroll
            for (int kind = 0; kind < 2; kind++) {
                const unsigned char *src =
                    reinterpret_cast<const unsigned char *>(cache + kv_offset(kv, block, kind, kv_head, slot));
                unsigned char *dst = stage + (kind * TILE + slot_in_tile) * ROW_BYTES;
#pragma unroll
                for (int i = 0; i < PIECES_PER_THREAD / 2; i++) {
                    /* pieces piece, piece + 8, ...: the 8 threads of a row copy 128 contiguous bytes per
                     * instruction (ncu: half-used sectors with runs of 32 bytes per thread, session 4) */
                    const int offset = (i * 8 + piece) * 16;
                    cp_async_16(dst + offset, src + offset);
                }
            }
        }
        cp_async_commit(); /* one group per tile, empty or not, so wait_group counts stay uniform */
    };
#pragma unroll
    for (int t = 0; t < STAGES; t++) issue_tile(t, table_block(t));

    /* Norm weights and this position's angles do not depend on the previous kernel either. */
    const decode_rope_lane rope = load_rope_lane(q_norm, k_norm, rope_cos, rope_sin, position, lane);
    pdl_wait();
    pdl_launch_dependents();
    prepare_query_and_new_kv<GROUP>(sm.st, rope, target.qkv, kv, block_table, position,
                                    begin <= position && position < end, target.head_group_0, n_heads,
                                    target.first_head, kv_head, eps, scale_log2, warp, WARPS);
    __syncthreads();

    float qr[GROUP][16], m[GROUP], l[GROUP], acc[GROUP][16];
    stream_start<GROUP>(sm.st, sub, qr, m, l, acc);

    for (int tile = 0; tile < n_tiles; tile++) {
        const int32_t refill_block = table_block(tile + STAGES); /* used after this tile's math */
        cp_async_wait<STAGES - 1>(); /* this thread's pieces of `tile` have landed */
        __syncthreads();             /* ... and everyone's */
        stream_add_staged<GROUP, TILE>(sm.st, sm.stages[tile % STAGES], stream, sub, begin + tile * TILE + stream,
                                       position, end, qr, m, l, acc);
        __syncthreads(); /* the stage is free again */
        issue_tile(tile + STAGES, refill_block);
    }
    cp_async_wait<0>();

    /* Streams -> warps (shuffles) -> block (shared memory) -> cluster (rank 0 reads every block's partial). */
    merge_warp_streams<GROUP>(m, l, acc);
    merge_scratch &ms = *reinterpret_cast<merge_scratch *>(sm.stages);
    __syncthreads();
    ms.template store<GROUP>(warp, lane, m, l, acc);
    __syncthreads();
    store_block_partial<GROUP>(sm.st, ms, threadIdx.x, THREADS);
    combine_cluster_partials<GROUP>(sm.st, target.out, target.first_head, threadIdx.x, THREADS);
}

/* The kernel family, for the host side in decode_cluster.cuh. */
struct kernels {
    static constexpr unsigned BLOCK_THREADS = THREADS;
    static constexpr const char *NAME = "cuda_attention_decode_cluster";
    template <int GROUP, typename OutT>
    static decltype(&attention_decode_cluster_kernel<GROUP, OutT>) kernel() {
        return attention_decode_cluster_kernel<GROUP, OutT>;
    }
    template <int GROUP>
    static size_t smem() { return sizeof(cluster_smem<GROUP>); }
};

} // namespace

extern "C" int cuda_attention_decode_cluster_size(int n_heads, cuda_kv_layer kv) {
    return decode_cluster_size<kernels, float>(n_heads, kv, 1, 8);
}

extern "C" void cuda_attention_decode_cluster_capacity(int n_heads, cuda_kv_layer kv, int cluster_size, int *clusters,
                                                       int *blocks_per_sm) {
    const decode_cluster_capacity c = decode_cluster_query<kernels, float>(cluster_size, n_heads, kv, 1);
    *clusters = c.clusters;
    *blocks_per_sm = c.blocks_per_sm;
}

extern "C" kite_status cuda_attention_decode_cluster(const float *qkv, float *out, cuda_kv_layer kv,
                                                     const int32_t *block_table, const int32_t *context_len,
                                                     const float *q_norm, const float *k_norm, const float *rope_cos,
                                                     const float *rope_sin, float eps, int n_heads, float scale,
                                                     int cluster_size, void *stream, int use_pdl) {
    if (cluster_size != 8 && cluster_size != 16)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda_attention_decode_cluster: cluster size %d", cluster_size);
    return run_decode_cluster<kernels>(qkv, out, kv, block_table, NULL, context_len, q_norm, k_norm, rope_cos,
                                       rope_sin, eps, n_heads, scale, 1, cluster_size, stream, use_pdl);
}

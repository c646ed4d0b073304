/* Decode attention for short contexts: a cluster kernel (the splits of a kv head are the CS blocks of a
 * thread-block cluster, their partial results combined through distributed shared memory, decode_cluster.cuh),
 * with the K/V tiles fed by bulk copies from a producer warp. Single stream: CS = 8 or 16. Batched
 * decode (cuda_attention_decode_bulk_rows): B sequences in one launch, CS = 1 .. 16 per (sequence, kv head)
 * so that all clusters are resident at once (decode_cluster.cuh).
 *
 * K/V rows reach shared memory in tiles of TILE positions by bulk copies (the copy engine; the rows of one
 * kv head inside a cache block are contiguous, so a tile is a few copies), STAGES tiles in flight. The
 * producer warp issues them, completing on a `full` mbarrier per stage; the consumer warps release a stage on
 * its `empty` mbarrier when they are done with it - no block-wide barrier per tile. Cached positions do not
 * depend on the previous kernel, so the producer never waits on it (PDL): the first STAGES tiles are
 * requested while that kernel still runs, which at short context is the block's whole range. After the wait
 * the consumers normalise and rotate their query heads (and, in the block that owns the new position, the
 * new K, appending K/V to the cache and keeping them in shared memory for their own use; the producer never
 * copies that position).
 *
 * Measured against a cluster kernel fed by cp.async (tg128, 0.6B, same runs, docs/cuda.md): faster at depth 256
 * (0.665-0.667 vs 0.680-0.700 ms per token), 1,024 (0.730 vs 0.764) and 2,048 (0.820 vs 0.839), slower at 4,096
 * (1.010 vs 0.948) and far slower at 16,384 (2.14 vs 1.42 ms with split-K). The split-K kernel is faster beyond 1,024
 * positions, so the backend runs this one up to 1,024 (bulk_max_context, set in cuda_backend.cu, used by
 * decode_path.cu).
 *
 * Grid (CS, kv_heads, sequences x head_groups); GROUP query heads per cluster share each K/V row they read.
 * Inside a block 32 streams of 8 consumer lanes take one position of a tile each; lane j of a stream holds
 * dims stream_dim(j, 0 .. 15) (decode_attention.cuh). */
#include "backend/cuda/kernels/bulk_copy.cuh"
#include "backend/cuda/kernels/decode_cluster.cuh"

namespace {

constexpr int HEAD_DIM = DECODE_HEAD_DIM;
constexpr int WARPS = 8;                         /* consumer warps */
constexpr int CONSUMERS = WARPS * 32;
constexpr int THREADS = CONSUMERS + 32;          /* and one producer warp */
constexpr int TILE = CONSUMERS / 8;              /* positions per tile: one per stream of 8 lanes */
/* Tiles in flight per block (16 KB each). 4 stages (68 KB) instead of 8 were meant to let clusters of 16 fit
 * (ncu: clusters of 8, 64 of 132 SMs); the size query still refuses 16 at one block per SM, but 4 stages measured
 * faster at short context all the same (0.648 vs 0.658 ms per 0.6B token at 256). */
constexpr int STAGES = 4;
constexpr int ROW_BYTES = HEAD_DIM * 2;          /* one K or V row, bf16 */
constexpr int TILE_BYTES = 2 * TILE * ROW_BYTES; /* K rows then V rows */

/* Named barrier 1 over the consumer warps only (the producer warp runs its own loop meanwhile). */
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(CONSUMERS) : "memory"); }

/* Shared memory of a block: the tile stages, then the values that outlive the loop. */
template <int GROUP>
struct cluster_smem {
    unsigned char stages[STAGES][TILE_BYTES];
    uint64_t full[STAGES], empty[STAGES]; /* a stage's bytes have landed / its consumer warps are done */
    decode_cluster_state<GROUP> st;
};

/* The batched producer's view of a block table: lane i of the producer warp holds entry base + i of a window
 * of 32 entries, and the next window is loaded while this one is in use, so a block's range of many cache
 * blocks (batched clusters of 1 or 2 blocks: 10-20 per block at depth 256) costs one L2 round trip instead of
 * one per cache block in the serial producer loop. Every lane calls entry() with the same index (a shuffle);
 * indices only grow. The single stream keeps one lane reading the table directly: with the window, measured
 * slower at depths 256 and 1,024 (0.664 / 0.764 vs 0.648 / 0.709 ms per 0.6B token) and with the bulk kernel
 * forced to long contexts (2.92 vs 2.15 ms at 16,384), for reasons not yet understood. */
struct table_window {
    const int32_t *table;
    int n_entries, base;
    int32_t current, next;

    __device__ __forceinline__ int32_t load(int index, int lane) const {
        return index + lane < n_entries ? table[index + lane] : -1;
    }
    __device__ __forceinline__ void init(const int32_t *table_, int n_entries_, int first, int lane) {
        table = table_;
        n_entries = n_entries_;
        base = first;
        current = load(base, lane);
        next = load(base + 32, lane);
    }
    __device__ __forceinline__ int32_t entry(int index, int lane) {
        while (index >= base + 32) {
            base += 32;
            current = next;
            next = load(base + 32, lane);
        }
        return __shfl_sync(0xffffffffu, current, index - base);
    }
};

/* The producer: copies the cached K and V rows of tile `tile` into its stage - positions [first, last) of the
 * block's range, the new position excluded - as runs of positions inside one cache block (contiguous rows);
 * lane 0 announces the bytes on the stage's `full` mbarrier and issues the copies. block_of(i) gives block-table
 * entry i (every calling lane asks for the same entries). */
template <int GROUP, typename BlockOf>
__device__ __forceinline__ void produce_tile(cluster_smem<GROUP> &sm, int tile, int begin, int end, int position,
                                             const cuda_kv_layer &kv, BlockOf &&block_of, int kv_head, int lane) {
    const int stage = tile % STAGES;
    const int first = begin + tile * TILE;
    int last = min(end, first + TILE);
    if (position >= first && position < last) last = position; /* the new position is the range's last */
    const unsigned bytes = last > first ? 2u * (unsigned)(last - first) * ROW_BYTES : 0u;
    if (lane == 0) mbar_expect_tx(&sm.full[stage], bytes); /* before the copies; no bytes: the phase completes now */
    const bf16 *cache = static_cast<const bf16 *>(kv.base);
    for (int p = first; p < last;) {
        const int32_t block = block_of(p / kv.block_size), slot = p % kv.block_size;
        const int run_end = min(last, (p / kv.block_size + 1) * kv.block_size);
        if (lane == 0) {
            const unsigned run_bytes = (unsigned)(run_end - p) * ROW_BYTES;
            unsigned char *dst = sm.stages[stage] + (p - first) * ROW_BYTES;
            bulk_copy_to_smem(dst, cache + kv_offset(kv, block, 0, kv_head, slot), run_bytes, &sm.full[stage]);
            bulk_copy_to_smem(dst + TILE * ROW_BYTES, cache + kv_offset(kv, block, 1, kv_head, slot), run_bytes,
                              &sm.full[stage]);
        }
        p = run_end;
    }
}

/* MIN_BLOCKS: blocks per SM the registers must allow. The batched path asks for 2 where that costs no spills
 * (GROUP <= 2: 96 registers instead of 123; GROUP 4 would spill), so twice as many sequences' clusters run at
 * once. The single stream keeps 1: with two blocks per SM possible, its clusters of 16 were placed two blocks
 * to an SM, on half the SMs (measured: 0.687 vs 0.647 ms per 0.6B token at depth 256). */
template <int GROUP, typename OutT, int MIN_BLOCKS, bool BATCHED>
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
    attention_decode_bulk_kernel(const float *qkv_rows, OutT *out_rows, cuda_kv_layer kv, const int32_t *block_tables,
                                 const int32_t *table_start, const int32_t *context_lens,
                                 const float *__restrict__ q_norm, const float *__restrict__ k_norm,
                                 const float *__restrict__ rope_cos, const float *__restrict__ rope_sin, float eps,
                                 int n_heads, float scale_log2) {
    using merge_scratch = warp_partials<WARPS, GROUP>; /* reuses the stages once every tile is consumed */
    static_assert(sizeof(merge_scratch) <= sizeof(((cluster_smem<GROUP> *)0)->stages), "merge scratch fits");
    extern __shared__ __align__(128) unsigned char smem_raw[];
    cluster_smem<GROUP> &sm = *reinterpret_cast<cluster_smem<GROUP> *>(smem_raw);
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();

    const int rank = (int)cluster.block_rank(), n_ranks = (int)cluster.num_blocks();
    const decode_cluster_target<OutT> target =
        locate_cluster_target<GROUP>(qkv_rows, out_rows, kv, block_tables, table_start, context_lens, n_heads);
    const int kv_head = target.kv_head;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane & 7;

    const int ctx = target.ctx, position = ctx - 1;
    const int chunk = (ctx + n_ranks - 1) / n_ranks;
    const int begin = min(ctx, rank * chunk), end = min(ctx, begin + chunk);
    const int n_tiles = (end - begin + TILE - 1) / TILE;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&sm.full[s], 1);
            mbar_init(&sm.empty[s], WARPS);
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (warp == WARPS) { /* the producer warp */
        auto produce = [&](auto &&block_of, int producer_lane) {
            for (int tile = 0; tile < n_tiles; tile++) {
                if (tile >= STAGES) mbar_wait(&sm.empty[tile % STAGES], (unsigned)((tile / STAGES - 1) & 1));
                produce_tile(sm, tile, begin, end, position, kv, block_of, kv_head, producer_lane);
            }
        };
        if (BATCHED) { /* the producer reads its block table through a window */
            table_window table;
            table.init(target.block_table, (ctx + kv.block_size - 1) / kv.block_size, begin / kv.block_size, lane);
            produce([&](int i) { return table.entry(i, lane); }, lane);
        } else if (lane == 0) {
            produce([&](int i) { return target.block_table[i]; }, 0);
        }
        __syncwarp();
        pdl_launch_dependents();
    } else {
        /* Norm weights and this position's angles do not depend on the previous kernel either. */
        const decode_rope_lane rope = load_rope_lane(q_norm, k_norm, rope_cos, rope_sin, position, lane);
        pdl_wait();
        pdl_launch_dependents();
        prepare_query_and_new_kv<GROUP>(sm.st, rope, target.qkv, kv, target.block_table, position,
                                        begin <= position && position < end, target.head_group_0, n_heads,
                                        target.first_head, kv_head, eps, scale_log2, warp, WARPS);
        consumers_sync();

        const int stream = warp * 4 + (lane >> 3);
        float qr[GROUP][16], m[GROUP], l[GROUP], acc[GROUP][16];
        stream_start<GROUP>(sm.st, sub, qr, m, l, acc);

        for (int tile = 0; tile < n_tiles; tile++) {
            const int stage = tile % STAGES;
            mbar_wait(&sm.full[stage], (unsigned)((tile / STAGES) & 1));
            stream_add_staged<GROUP, TILE>(sm.st, sm.stages[stage], stream, sub, begin + tile * TILE + stream,
                                           position, end, qr, m, l, acc);
            __syncwarp();
            if (lane == 0) mbar_arrive(&sm.empty[stage]); /* this warp is done with the stage */
        }

        /* Streams -> warps (shuffles) -> block (shared memory) -> cluster (rank 0 reads every partial). The
         * stages are free: every tile was consumed, so no copy is still in flight. */
        merge_warp_streams<GROUP>(m, l, acc);
        merge_scratch &ms = *reinterpret_cast<merge_scratch *>(sm.stages);
        consumers_sync();
        ms.template store<GROUP>(warp, lane, m, l, acc);
        consumers_sync();
        /* The batched path's clusters of one block (B = 17-32): the block's result is the output (measured: B=32
         * -1.9% per step). Batched only: the same branch in the single-stream kernel, whose clusters are of 8 or 16,
         * made it 2.9% slower at depth 256. */
        if (BATCHED && n_ranks == 1) {
            store_block_out<GROUP>(ms, target.out, target.first_head, threadIdx.x, CONSUMERS);
            return;
        }
        store_block_partial<GROUP>(sm.st, ms, threadIdx.x, CONSUMERS);
    }
    if (!BATCHED || n_ranks > 1)
        combine_cluster_partials<GROUP>(sm.st, target.out, target.first_head, threadIdx.x, THREADS);
}

/* The kernel families, for the host side in decode_cluster.cuh: single stream, and batched (two blocks per
 * SM where GROUP allows, see MIN_BLOCKS; the producer's table window). */
template <bool BATCHED>
struct kernels {
    static constexpr unsigned BLOCK_THREADS = THREADS;
    static constexpr const char *NAME = BATCHED ? "cuda_attention_decode_bulk_rows" : "cuda_attention_decode_bulk";
    template <int GROUP>
    static constexpr int min_blocks() { return BATCHED && GROUP <= 2 ? 2 : 1; }
    template <int GROUP, typename OutT>
    static decltype(&attention_decode_bulk_kernel<GROUP, OutT, min_blocks<GROUP>(), BATCHED>) kernel() {
        return attention_decode_bulk_kernel<GROUP, OutT, min_blocks<GROUP>(), BATCHED>;
    }
    template <int GROUP>
    static size_t smem() { return sizeof(cluster_smem<GROUP>); }
};

} // namespace

/* The bulk-fed kernels stage bf16 rows: an fp8 cache takes the split-K kernel (attention_decode.cu), which reads
 * codes and scales directly; these refuse it by name. */
static kite_status refuse_fp8(const cuda_kv_layer &kv, const char *name) {
    if (kv.dtype == KITE_KV_CACHE_BF16) return KITE_OK;
    return kite_fail(KITE_ERROR_UNSUPPORTED,
                     "%s: the bulk-fed cluster attention reads a bf16 KV cache only (dtype %d; an fp8 cache takes the "
                     "split-K kernel, cuda_attention_decode)",
                     name, kv.dtype);
}

extern "C" int cuda_attention_decode_bulk_size(int n_heads, cuda_kv_layer kv) {
    if (kv.dtype != KITE_KV_CACHE_BF16) return 0;
    return decode_cluster_size<kernels<false>, float>(n_heads, kv, 1, 8);
}

extern "C" kite_status cuda_attention_decode_bulk(const float *qkv, float *out, cuda_kv_layer kv,
                                                  const int32_t *block_table, const int32_t *context_len,
                                                  const float *q_norm, const float *k_norm, const float *rope_cos,
                                                  const float *rope_sin, float eps, int n_heads, float scale,
                                                  int cluster_size, void *stream, int use_pdl) {
    if (cluster_size != 8 && cluster_size != 16)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda_attention_decode_bulk: cluster size %d", cluster_size);
    KITE_TRY(refuse_fp8(kv, "cuda_attention_decode_bulk"));
    return run_decode_cluster<kernels<false>>(qkv, out, kv, block_table, NULL, context_len, q_norm, k_norm, rope_cos,
                                              rope_sin, eps, n_heads, scale, 1, cluster_size, stream, use_pdl);
}

extern "C" void cuda_attention_decode_bulk_capacity(int n_heads, cuda_kv_layer kv, int cluster_size, int batched,
                                                    int *clusters, int *blocks_per_sm) {
    const decode_cluster_capacity c = batched
                                          ? decode_cluster_query<kernels<true>, bf16>(cluster_size, n_heads, kv, 1)
                                          : decode_cluster_query<kernels<false>, float>(cluster_size, n_heads, kv, 1);
    *clusters = c.clusters;
    *blocks_per_sm = c.blocks_per_sm;
}

extern "C" int cuda_attention_decode_bulk_rows_size(int n_heads, cuda_kv_layer kv, int n_seqs) {
    if (kv.dtype != KITE_KV_CACHE_BF16) return 0;
    return decode_cluster_size<kernels<true>, bf16>(n_heads, kv, n_seqs, 1);
}

extern "C" kite_status cuda_attention_decode_bulk_rows(const float *qkv, void *out, int out_bf16, cuda_kv_layer kv,
                                                       const int32_t *block_tables, const int32_t *table_start,
                                                       const int32_t *context_lens, const float *q_norm,
                                                       const float *k_norm, const float *rope_cos,
                                                       const float *rope_sin, float eps, int n_heads, float scale,
                                                       int n_seqs, int cluster_size, void *stream, int use_pdl) {
    KITE_TRY(refuse_fp8(kv, "cuda_attention_decode_bulk_rows"));
    if (out_bf16)
        return run_decode_cluster<kernels<true>>(qkv, static_cast<bf16 *>(out), kv, block_tables, table_start,
                                                 context_lens, q_norm, k_norm, rope_cos, rope_sin, eps, n_heads, scale,
                                                 n_seqs, cluster_size, stream, use_pdl);
    return run_decode_cluster<kernels<true>>(qkv, static_cast<float *>(out), kv, block_tables, table_start,
                                             context_lens, q_norm, k_norm, rope_cos, rope_sin, eps, n_heads, scale,
                                             n_seqs, cluster_size, stream, use_pdl);
}

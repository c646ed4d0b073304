/* Split-K flash-decoding attention for one new token over the paged KV cache, with the token's Q/K
 * RMSNorm, RoPE and KV append fused in (one kernel instead of two per layer on the decode path).
 *
 * Grid (kv_head, split, sequence x head_group; the batched decode path runs B sequences, each with its own
 * context length and block table, in one launch): a fixed grid whatever the context length, so the decode graph
 * replays it unchanged; each block takes one contiguous range of positions (context_len / n_splits
 * rounded up), for GROUP query heads that share the kv head, reading each K and V row once.
 * Inside a block 16 independent streams of 8 lanes walk the range (stream i takes positions i, i + 16,
 * ...); lane j of a stream holds 16 dims of K, V and the accumulator (stream_dim), so one position
 * costs each lane two 16-byte loads of K and two of V. Each stream keeps its own running max and sum
 * (online softmax in fp32, base 2; the accumulator is rescaled only when a score passes the max by more than
 * 2^8, online_softmax_add_warp); streams merge by shuffles, warps through shared memory, splits in the last
 * block to finish (a per-head-group counter, reset by that block; combine_splits, two phases of independent
 * loads).
 * Each split covers at least MIN_CHUNK positions, so a short context uses few splits (blocks past the
 * last used split leave at once); with one split the block writes the output itself (no workspace, no
 * counter, no combine: the latency chain of a short-context step is what costs there). Every block normalises and rotates its own
 * query heads from the QKV projection; the block whose range holds the new position writes the new K and
 * V to the cache before reading it. Before waiting on the previous kernel (PDL) each lane loads its first
 * round of cache rows: they do not depend on that kernel.
 * An fp8 cache (kv.dtype, cuda_ops.h's layout) takes the FP8 instances: each position is one 16-byte load of K codes,
 * one of V codes and two scales per lane, half the bytes of bf16 (decode_cache<true>); the append quantizes the
 * new K and V in the warp that computes them (kv_fp8.cuh). */
#include "backend/cuda/kernels/decode_attention.cuh"
#include "backend/cuda/kernels/kv_fp8.cuh"

namespace {

constexpr int HEAD_DIM = DECODE_HEAD_DIM;
constexpr int THREADS = 128;
constexpr int STREAMS = THREADS / 8;
constexpr int MIN_CHUNK = 32; /* 256 measured worse at depth 256: 16.2 us vs 9 us per layer (serial rounds) */

__device__ __forceinline__ void load_row(const bf16 *row, int sub, uint4 &a, uint4 &b) {
    const uint4 *p = reinterpret_cast<const uint4 *>(row);
    a = __ldcs(p + sub); /* the cache is streamed: read once per step; pieces sub, sub + 8 (stream_dim) */
    b = __ldcs(p + sub + 8);
}

/* Normalises (RMSNorm * weight) and rotates (RoPE, rotate-half) one head of 128 values with a warp:
 * lane l holds dims 2l, 2l + 1, 64 + 2l, 65 + 2l; its weights w and angles (c, s) are loaded earlier. */
__device__ __forceinline__ void norm_rope_head(const float *src, const float w[4], float2 c, float2 s, float eps,
                                               int lane, float out[4]) {
    const int d0 = 2 * lane, d1 = HEAD_DIM / 2 + 2 * lane;
    norm_rope_lane(*reinterpret_cast<const float2 *>(src + d0), *reinterpret_cast<const float2 *>(src + d1), w, c, s,
                   eps, out);
}


/* Carries a slot past the end of its cache block into the following blocks: (block, slot) of the same position. */
__device__ __forceinline__ void carry_slot(int &block, int &slot, int block_size) {
    while (slot >= block_size) {
        slot -= block_size;
        block++;
    }
}

/* Merges running (max, sum) pairs (base 2): (m, l) takes in (m_other, l_other). */
__device__ __forceinline__ void merge_max_sum(float &m, float &l, float m_other, float l_other) {
    const float m_new = fmaxf(m, m_other);
    l = l * exp2f(m - m_new) + l_other * exp2f(m_other - m_new);
    m = m_new;
}

/* Combines the n_used splits of GROUP heads, written to the workspace rows (first_row + g) * n_splits + split,
 * into out_heads (GROUP rows of HEAD_DIM). It runs in the last block to finish, so it is the kernel's tail, and
 * its loads are issued in as few rounds as the registers allow (each round about one L2 round trip):
 *   1. thread t folds the (max, sum) of splits t, t + THREADS, ...; the block merges them; thread t keeps split
 *      t's pair, so its weight exp2(max - overall max) goes to shared memory without a second load;
 *   2. warp w sums the accumulators of splits w, w + WARPS, ... (4 dims per lane), COMBINE_BATCH splits' loads
 *      in flight at once, each scaled by its weight; the warps' sums meet in shared memory.
 * (One thread per dim looping over all splits was a chain of ~36 dependent L2 round trips at 66 splits.) */
template <int GROUP>
struct combine_scratch {
    float weight[GROUP][THREADS]; /* exp2(split max - overall max) of the splits of one pass */
};

template <int GROUP, typename OutT>
__device__ __forceinline__ void combine_splits(warp_partials<THREADS / 32, GROUP> &partials,
                                               combine_scratch<GROUP> &scratch, const float *ws_acc,
                                               const float2 *ws_stats, size_t first_row, int n_splits, int n_used,
                                               OutT *out_heads) {
    static_assert(THREADS == HEAD_DIM, "thread d writes output dim d");
    constexpr int WARPS = THREADS / 32;
    /* Splits per warp in flight: 2 x 9 float4 at GROUP 2 (two rounds for 66 splits, the kernel stays at 126
     * registers); 8 at GROUP 1 (18 took it from 91 to 128 registers, 4 blocks per SM instead of 5). */
    constexpr int COMBINE_BATCH = GROUP == 1 ? 8 : 18 / GROUP;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    float m[GROUP], l[GROUP];
    float2 own[GROUP]; /* split threadIdx.x's (max, sum), when it exists */
#pragma unroll
    for (int g = 0; g < GROUP; g++) {
        m[g] = DECODE_NO_SCORE;
        l[g] = 0.0f;
        own[g] = make_float2(DECODE_NO_SCORE, 0.0f);
    }
    for (int sp = threadIdx.x; sp < n_used; sp += THREADS) {
#pragma unroll
        for (int g = 0; g < GROUP; g++) {
            const float2 st = __ldcg(&ws_stats[(first_row + g) * (size_t)n_splits + sp]);
            if (sp == (int)threadIdx.x) own[g] = st;
            merge_max_sum(m[g], l[g], st.x, st.y);
        }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
#pragma unroll
        for (int g = 0; g < GROUP; g++) {
            const float m_other = __shfl_xor_sync(0xffffffffu, m[g], offset);
            const float l_other = __shfl_xor_sync(0xffffffffu, l[g], offset);
            merge_max_sum(m[g], l[g], m_other, l_other);
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int g = 0; g < GROUP; g++) {
            partials.m[warp][g] = m[g];
            partials.l[warp][g] = l[g];
        }
    }
    __syncthreads();
    float m_all[GROUP], l_all[GROUP];
#pragma unroll
    for (int g = 0; g < GROUP; g++) {
        m_all[g] = DECODE_NO_SCORE;
        l_all[g] = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) merge_max_sum(m_all[g], l_all[g], partials.m[w][g], partials.l[w][g]);
    }

    float4 a[GROUP];
#pragma unroll
    for (int g = 0; g < GROUP; g++) a[g] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int base = 0; base < n_used; base += THREADS) { /* one pass unless there are more splits than threads */
        const int sp = base + (int)threadIdx.x;
        if (sp < n_used) {
#pragma unroll
            for (int g = 0; g < GROUP; g++) {
                const float2 st = base == 0 ? own[g] : __ldcg(&ws_stats[(first_row + g) * (size_t)n_splits + sp]);
                scratch.weight[g][threadIdx.x] = exp2f(st.x - m_all[g]);
            }
        }
        __syncthreads();
        const int count = min(THREADS, n_used - base);
        for (int first = warp; first < count; first += WARPS * COMBINE_BATCH) {
            float4 v[COMBINE_BATCH][GROUP];
#pragma unroll
            for (int u = 0; u < COMBINE_BATCH; u++) {
                const int i = first + u * WARPS;
#pragma unroll
                for (int g = 0; g < GROUP; g++) {
                    const size_t row = (first_row + g) * (size_t)n_splits + (size_t)(base + i);
                    v[u][g] = i < count ? __ldcg(reinterpret_cast<const float4 *>(ws_acc + row * HEAD_DIM) + lane)
                                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
            }
#pragma unroll
            for (int u = 0; u < COMBINE_BATCH; u++) {
                const int i = first + u * WARPS;
                if (i >= count) break;
#pragma unroll
                for (int g = 0; g < GROUP; g++) {
                    const float f = scratch.weight[g][i];
                    a[g].x += v[u][g].x * f;
                    a[g].y += v[u][g].y * f;
                    a[g].z += v[u][g].z * f;
                    a[g].w += v[u][g].w * f;
                }
            }
        }
        __syncthreads(); /* the weights of this pass are read before the next pass writes them */
    }
#pragma unroll
    for (int g = 0; g < GROUP; g++) *reinterpret_cast<float4 *>(&partials.acc[warp][g][4 * lane]) = a[g];
    __syncthreads();
    const int d = threadIdx.x;
#pragma unroll
    for (int g = 0; g < GROUP; g++) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) sum += partials.acc[w][g][d];
        store_decode_out(&out_heads[(size_t)g * HEAD_DIM + d], sum / l_all[g]);
    }
}

/* One kv head's rows of the cache as the kernel reads them, bf16 or fp8 (cuda_ops.h's layouts): `rows(block)` is the
 * head's first K row in a physical block, `load` takes one position's pieces for lane `sub` of a stream, `fold` adds
 * them to the stream's softmax state.
 * bf16: per position two 16-byte pieces of K and of V (stream_dim's dims, 8 bf16 each).
 * fp8: one 16-byte piece of K codes and one of V codes (16 codes: lane j of a stream holds dims 16 j .. 16 j + 15,
 * stream_dim_fp8) and the two float32 scales (the same address for the stream's 8 lanes: one broadcast load). The
 * K scale multiplies the score (the dot product of the query with the codes), the V scale the probability: the
 * values are code x scale as the CPU oracle reads them, with half the bytes of bf16. */
template <bool FP8>
struct decode_cache;

template <>
struct decode_cache<false> {
    struct piece {
        uint4 k[2], v[2];
    };
    const unsigned char *head; /* the kv head's K rows in block 0 */
    size_t block_stride, v_offset;
    __device__ __forceinline__ decode_cache(const cuda_kv_layer &kv, int kv_head) {
        block_stride = cuda_kv_block_bytes(kv);
        v_offset = (size_t)kv.n_kv_heads * kv.block_size * HEAD_DIM * sizeof(bf16);
        head = static_cast<const unsigned char *>(kv.base) + (size_t)kv_head * kv.block_size * HEAD_DIM * sizeof(bf16);
    }
    __device__ __forceinline__ const unsigned char *rows(int32_t block) const {
        return head + (size_t)block * block_stride;
    }
    __device__ __forceinline__ void load(const unsigned char *block_rows, int slot, int sub, piece &p) const {
        const bf16 *row = reinterpret_cast<const bf16 *>(block_rows) + (size_t)slot * HEAD_DIM;
        load_row(row, sub, p.k[0], p.k[1]);
        load_row(reinterpret_cast<const bf16 *>(reinterpret_cast<const unsigned char *>(row) + v_offset), sub, p.v[0],
                 p.v[1]);
    }
    static __device__ __forceinline__ void zero(piece &p) {
        p.k[0] = p.k[1] = p.v[0] = p.v[1] = make_uint4(0, 0, 0, 0);
    }
    static __device__ __forceinline__ int dim(int sub, int i) { return stream_dim(sub, i); }
    template <int GROUP>
    static __device__ __forceinline__ void fold(const piece &p, bool valid, const float (&qr)[GROUP][16],
                                                float (&m)[GROUP], float (&l)[GROUP], float (&acc)[GROUP][16]) {
        float kf[16], vf[16];
        bf16x8_to_float(p.k[0], kf);
        bf16x8_to_float(p.k[1], kf + 8);
        float s[GROUP];
        stream_scores<GROUP>(qr, kf, s);
        if (!valid) {
#pragma unroll
            for (int g = 0; g < GROUP; g++) s[g] = -INFINITY; /* adds nothing, moves no max */
        }
        bf16x8_to_float(p.v[0], vf);
        bf16x8_to_float(p.v[1], vf + 8);
        online_softmax_add_warp<GROUP>(m, l, acc, s, vf);
    }
};

template <>
struct decode_cache<true> {
    struct piece {
        uint4 k, v;
        float k_scale, v_scale;
    };
    const unsigned char *head;   /* the kv head's K codes in block 0 */
    size_t block_stride, v_offset; /* V codes after K codes */
    size_t scale_offset;         /* from a head's K codes to its K scales (V scales v_scale_offset further) */
    size_t v_scale_offset;
    __device__ __forceinline__ decode_cache(const cuda_kv_layer &kv, int kv_head) {
        const size_t head_codes = (size_t)kv.block_size * HEAD_DIM;
        block_stride = cuda_kv_block_bytes(kv);
        v_offset = (size_t)kv.n_kv_heads * head_codes;
        head = static_cast<const unsigned char *>(kv.base) + (size_t)kv_head * head_codes;
        scale_offset = 2 * v_offset - (size_t)kv_head * head_codes + (size_t)kv_head * kv.block_size * sizeof(float);
        v_scale_offset = (size_t)kv.n_kv_heads * kv.block_size * sizeof(float);
    }
    __device__ __forceinline__ const unsigned char *rows(int32_t block) const {
        return head + (size_t)block * block_stride;
    }
    __device__ __forceinline__ void load(const unsigned char *block_rows, int slot, int sub, piece &p) const {
        const unsigned char *row = block_rows + (size_t)slot * HEAD_DIM;
        p.k = __ldcs(reinterpret_cast<const uint4 *>(row) + sub);
        p.v = __ldcs(reinterpret_cast<const uint4 *>(row + v_offset) + sub);
        const float *scales = reinterpret_cast<const float *>(block_rows + scale_offset) + slot;
        p.k_scale = __ldcs(scales);
        p.v_scale = __ldcs(reinterpret_cast<const float *>(reinterpret_cast<const unsigned char *>(scales) +
                                                           v_scale_offset));
    }
    static __device__ __forceinline__ void zero(piece &p) {
        p.k = p.v = make_uint4(0, 0, 0, 0);
        p.k_scale = p.v_scale = 0.0f;
    }
    static __device__ __forceinline__ int dim(int sub, int i) { return stream_dim_fp8(sub, i); }
    template <int GROUP>
    static __device__ __forceinline__ void fold(const piece &p, bool valid, const float (&qr)[GROUP][16],
                                                float (&m)[GROUP], float (&l)[GROUP], float (&acc)[GROUP][16]) {
        float kf[16], vf[16];
        kv_fp8x16_to_float(p.k, kf);
        float s[GROUP];
        stream_scores<GROUP>(qr, kf, s);
#pragma unroll
        for (int g = 0; g < GROUP; g++) s[g] = valid ? s[g] * p.k_scale : -INFINITY;
        kv_fp8x16_to_float(p.v, vf);
        online_softmax_add_warp<GROUP>(m, l, acc, s, vf, p.v_scale);
    }
};

/* blockIdx.z = sequence * head groups + head group. Sequence s reads its QKV row s, writes its output row
 * s, takes its block table at block_tables + table_start[s] (table_start NULL: one sequence, offset 0).
 * PREPARED: the input rows are the query heads alone, bf16 (n_heads * HEAD_DIM per row), already normalised and
 * rotated, and the new K and V are already in the cache (the prefill path's decode rows, cuda_qk_norm_rope_kv):
 * no norm, no RoPE, no append; q_norm, k_norm, rope_cos and rope_sin are not read. */
template <int GROUP, typename OutT, bool FP8, bool PREPARED>
__global__ void __launch_bounds__(THREADS)
    attention_decode_kernel(const void *qkv_rows, OutT *out_rows, cuda_kv_layer kv, const int32_t *block_tables,
                            const int32_t *table_start, const int32_t *context_lens, const float *__restrict__ q_norm,
                            const float *__restrict__ k_norm, const float *__restrict__ rope_cos,
                            const float *__restrict__ rope_sin, float eps, int n_heads, float scale_log2,
                            int n_splits, float *ws_acc, float2 *ws_stats, unsigned *counters) {
    __shared__ warp_partials<THREADS / 32, GROUP> partials;
    __shared__ combine_scratch<GROUP> scratch;
    __shared__ float smem_q[GROUP][HEAD_DIM];
    __shared__ bool is_last;

    const int kv_head = blockIdx.x, split = blockIdx.y;
    const int group_heads = n_heads / kv.n_kv_heads;
    const int head_groups = group_heads / GROUP;
    const int seq = (int)blockIdx.z / head_groups;
    const int first_head = kv_head * group_heads + ((int)blockIdx.z % head_groups) * GROUP;
    const float *qkv = PREPARED ? NULL
                                : static_cast<const float *>(qkv_rows) +
                                      (size_t)seq * (size_t)(n_heads + 2 * kv.n_kv_heads) * HEAD_DIM;
    const bf16 *q_prepared = PREPARED ? static_cast<const bf16 *>(qkv_rows) + (size_t)seq * (size_t)n_heads * HEAD_DIM
                                      : NULL;
    OutT *out = out_rows + (size_t)seq * (size_t)n_heads * HEAD_DIM;
    const int32_t *block_table = block_tables + (table_start ? table_start[seq] : 0);
    const size_t seq_heads = (size_t)seq * (size_t)n_heads; /* this sequence's rows of the workspace */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane & 7;
    const int stream = warp * 4 + (lane >> 3);
    /* The context length and block table come from the step buffer, written before the graph ran. */
    const int ctx = context_lens[seq];
    int chunk = (ctx + n_splits - 1) / n_splits;
    if (chunk < MIN_CHUNK) chunk = MIN_CHUNK;
    const int n_used = (ctx + chunk - 1) / chunk;
    const int begin = split * chunk;
    const int end = min(ctx, begin + chunk);
    const int position = ctx - 1;

    /* Cache layout: per block, K rows of every kv head, then V rows; a head's rows are contiguous. */
    using cache_view = decode_cache<FP8>;
    using piece = typename cache_view::piece;
    const cache_view cache(kv, kv_head);
    const int n_rounds = end > begin ? (end - begin + STREAMS - 1) / STREAMS : 0;
    /* Rounds in which every stream has a position: loaded and folded without checks. */
    const int full_rounds = end > begin ? (end - begin) / STREAMS : 0;
    /* The stream's next position: its cache block and slot, and the block's rows, looked up in the block table only
     * when the stream enters a block it reads (once per block_size / STREAMS positions). The loop is partly bound by
     * its instructions: a table load, its address arithmetic and a division-free carry per position, and the
     * validity checks in rounds where every stream has a position, cost 3.0% of a 0.6B step at depth 16,384
     * (docs/cuda.md). */
    int block = (begin + stream) / kv.block_size, slot = (begin + stream) % kv.block_size;
    auto rows_of_block = [&](int logical) { return cache.rows(block_table[logical]); };
    const unsigned char *block_rows = cache.rows(0);
    auto step_position = [&]() {
        slot += STREAMS;
        if (slot >= kv.block_size) {
            carry_slot(block, slot, kv.block_size);
            if (block * kv.block_size < end) block_rows = rows_of_block(block);
        }
    };
    /* Two positions per stream and round in flight: 8 loads of 16 bytes per lane (bf16), 4 and 2 scales (fp8). */
    auto load_round = [&](int round, piece (&kv_pieces)[2], bool (&valid)[2]) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int p = begin + (round + j) * STREAMS + stream;
            valid[j] = (round + j) < n_rounds && p < end;
            if (valid[j]) cache.load(block_rows, slot, sub, kv_pieces[j]);
            else cache_view::zero(kv_pieces[j]);
            step_position();
        }
    };
    auto load_full_round = [&](piece (&kv_pieces)[2]) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            cache.load(block_rows, slot, sub, kv_pieces[j]);
            step_position();
        }
    };
    /* The first round's cached rows do not depend on the previous kernel: loaded before waiting for it, unless
     * this block writes the new position in that round (it must write before it reads). */
    const bool early = split < n_used && (PREPARED || !(begin <= position && position < begin + 2 * STREAMS));
    if (split < n_used && begin + stream < end) block_rows = rows_of_block(block);
    piece first[2];
    bool valid_first[2];
    if (early) load_round(0, first, valid_first);
    /* Norm weights and this position's angles do not depend on the previous kernel either. */
    const int d0 = 2 * lane, d1 = HEAD_DIM / 2 + 2 * lane;
    float qw[4] = {}, kw[4] = {};
    float2 rc = make_float2(0.0f, 0.0f), rs = make_float2(0.0f, 0.0f);
    if (!PREPARED) {
        qw[0] = q_norm[d0], qw[1] = q_norm[d0 + 1], qw[2] = q_norm[d1], qw[3] = q_norm[d1 + 1];
        kw[0] = k_norm[d0], kw[1] = k_norm[d0 + 1], kw[2] = k_norm[d1], kw[3] = k_norm[d1 + 1];
        rc = *reinterpret_cast<const float2 *>(rope_cos + (size_t)position * (HEAD_DIM / 2) + d0);
        rs = *reinterpret_cast<const float2 *>(rope_sin + (size_t)position * (HEAD_DIM / 2) + d0);
    }
    pdl_wait();
    pdl_launch_dependents();
    if (split >= n_used) return;

    if (PREPARED) { /* the query heads as they are; thread t of the block holds dim t of each */
        static_assert(THREADS == HEAD_DIM, "thread d loads dim d");
#pragma unroll
        for (int g = 0; g < GROUP; g++)
            smem_q[g][threadIdx.x] =
                __bfloat162float(q_prepared[(size_t)(first_head + g) * HEAD_DIM + threadIdx.x]) * scale_log2;
    }

    /* The query heads of this block, and (in the block that owns the new position) the new K and V. */
    const bool owns_new = begin <= position && position < end;
    for (int item = warp; !PREPARED && item < GROUP + 2; item += THREADS / 32) {
        if (item < GROUP) {
            float v[4];
            norm_rope_head(qkv + (size_t)(first_head + item) * HEAD_DIM, qw, rc, rs, eps, lane, v);
            smem_q[item][2 * lane] = v[0] * scale_log2;
            smem_q[item][2 * lane + 1] = v[1] * scale_log2;
            smem_q[item][HEAD_DIM / 2 + 2 * lane] = v[2] * scale_log2;
            smem_q[item][HEAD_DIM / 2 + 2 * lane + 1] = v[3] * scale_log2;
        } else if (owns_new) {
            const int32_t block = block_table[position / kv.block_size], slot = position % kv.block_size;
            const int kind = item - GROUP; /* 0: K, 1: V */
            const float *src = qkv + (size_t)(n_heads + kind * kv.n_kv_heads + kv_head) * HEAD_DIM;
            float v[4];
            if (kind == 0) {
                norm_rope_head(src, kw, rc, rs, eps, lane, v);
            } else {
                v[0] = src[2 * lane];
                v[1] = src[2 * lane + 1];
                v[2] = src[HEAD_DIM / 2 + 2 * lane];
                v[3] = src[HEAD_DIM / 2 + 2 * lane + 1];
            }
            if (FP8) {
                kv_fp8_store_warp(kv, block, kind, kv_head, slot, v, lane);
            } else {
                bf16 *dst = static_cast<bf16 *>(kv.base) + kv_offset(kv, block, kind, kv_head, slot);
                *reinterpret_cast<uint32_t *>(dst + 2 * lane) = pack_bf16x2(v[0], v[1]);
                *reinterpret_cast<uint32_t *>(dst + HEAD_DIM / 2 + 2 * lane) = pack_bf16x2(v[2], v[3]);
            }
        }
    }
    __syncthreads(); /* smem_q ready; the new K/V row is in global memory for this block's reads */

    float qr[GROUP][16];
#pragma unroll
    for (int g = 0; g < GROUP; g++)
#pragma unroll
        for (int i = 0; i < 16; i++) qr[g][i] = smem_q[g][cache_view::dim(sub, i)];
    float m[GROUP], l[GROUP], acc[GROUP][16];
    stream_init<GROUP>(m, l, acc);

    auto fold_round = [&](const piece (&kv_pieces)[2], const bool (&valid)[2]) {
#pragma unroll
        for (int j = 0; j < 2; j++) cache_view::template fold<GROUP>(kv_pieces[j], valid[j], qr, m, l, acc);
    };
    int round = 0;
    if (early) {
        fold_round(first, valid_first);
        round = 2;
    }
    const bool all_valid[2] = {true, true};
    for (; round + 1 < full_rounds; round += 2) {
        piece kv_pieces[2];
        load_full_round(kv_pieces);
        fold_round(kv_pieces, all_valid);
    }
    for (; round < n_rounds; round += 2) {
        piece kv_pieces[2];
        bool valid[2];
        load_round(round, kv_pieces, valid);
        fold_round(kv_pieces, valid);
    }

    merge_warp_streams<GROUP>(m, l, acc);
    partials.template store<GROUP, FP8>(warp, lane, m, l, acc);
    __syncthreads();

    /* This split's partial result per head: thread d owns dim d. */
    const int d = threadIdx.x;
#pragma unroll
    for (int g = 0; g < GROUP; g++) {
        float m_all, l_all, a_all;
        partials.merge(g, d, m_all, l_all, a_all);
        if (n_used == 1) { /* the only split: this is the result */
            store_decode_out(&out[(size_t)(first_head + g) * HEAD_DIM + d], a_all / l_all);
            continue;
        }
        const size_t index = (seq_heads + (size_t)(first_head + g)) * (size_t)n_splits + (size_t)split;
        ws_acc[index * HEAD_DIM + d] = a_all;
        if (d == 0) ws_stats[index] = make_float2(m_all, l_all);
    }
    if (n_used == 1) return;

    /* The last block of this head group to finish combines all splits. */
    const unsigned counter_index = (unsigned)(seq_heads / GROUP) + (unsigned)(first_head / GROUP);
    const bool last = block_arrive_is_last(&counters[counter_index], (unsigned)n_used, &is_last);
    if (!last) return;
    combine_splits<GROUP>(partials, scratch, ws_acc, ws_stats, seq_heads + (size_t)first_head, n_splits, n_used,
                          out + (size_t)first_head * HEAD_DIM);
    if (threadIdx.x == 0) counters[counter_index] = 0;
}

} // namespace

extern "C" kite_status cuda_attention_decode_blocks_per_sm(int n_heads, int n_kv_heads, int kv_dtype, int *blocks) {
    if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda_attention_decode: %d heads over %d kv heads", n_heads, n_kv_heads);
    const int group = decode_group_size(n_heads / n_kv_heads);
    const bool fp8 = kv_dtype == KITE_KV_CACHE_FP8;
    /* The fp32- and bf16-output kernels of a group (single stream, batches) may differ: the fewer counts. */
    int as_f32 = 0, as_bf16 = 0;
#define OCCUPANCY_DTYPE(G, FP8)                                                                          \
    do {                                                                                                 \
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&as_f32, attention_decode_kernel<G, float, FP8, false>, \
                                                                 THREADS, 0));                           \
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&as_bf16, attention_decode_kernel<G, bf16, FP8, false>, \
                                                                 THREADS, 0));                           \
    } while (0)
#define OCCUPANCY(G)                                                                                     \
    do {                                                                                                 \
        if (fp8) OCCUPANCY_DTYPE(G, true);                                                               \
        else OCCUPANCY_DTYPE(G, false);                                                                  \
    } while (0)
    switch (group) {
    case 4: OCCUPANCY(4); break;
    case 2: OCCUPANCY(2); break;
    default: OCCUPANCY(1); break;
    }
#undef OCCUPANCY
#undef OCCUPANCY_DTYPE
    *blocks = as_f32 < as_bf16 ? as_f32 : as_bf16;
    if (*blocks < 1) *blocks = 1;
    return KITE_OK;
}

extern "C" size_t cuda_attention_decode_workspace(int n_heads, int head_dim, int n_splits) {
    return (size_t)n_heads * (size_t)n_splits * ((size_t)head_dim * sizeof(float) + sizeof(float2));
}

namespace {

template <typename OutT, bool PREPARED>
kite_status attention_decode_launch(const void *qkv, OutT *out, cuda_kv_layer kv, const int32_t *block_tables,
                                    const int32_t *table_start, const int32_t *context_lens, const float *q_norm,
                                    const float *k_norm, const float *rope_cos, const float *rope_sin, float eps,
                                    int n_heads, float scale, int n_seqs, int n_splits, void *workspace,
                                    unsigned *counters, void *stream, int use_pdl) {
    if (kv.head_dim != HEAD_DIM || kv.n_kv_heads <= 0 || n_heads % kv.n_kv_heads != 0 || n_splits <= 0 || n_seqs <= 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda_attention_decode: head_dim %d heads %d kv heads %d splits %d seqs %d",
                         kv.head_dim, n_heads, kv.n_kv_heads, n_splits, n_seqs);
    if (kv.dtype != KITE_KV_CACHE_BF16 && kv.dtype != KITE_KV_CACHE_FP8)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda_attention_decode: KV cache dtype %d is not bf16 or fp8", kv.dtype);
    const int group_heads = n_heads / kv.n_kv_heads;
    const int group = decode_group_size(group_heads);
    const dim3 grid(kv.n_kv_heads, n_splits, (group_heads / group) * n_seqs);
    float *ws_acc = static_cast<float *>(workspace);
    float2 *ws_stats = reinterpret_cast<float2 *>(ws_acc + (size_t)n_seqs * (size_t)n_heads * (size_t)n_splits * HEAD_DIM);
    const float scale_log2 = scale * 1.4426950408889634f;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const bool pdl = use_pdl != 0;
#define LAUNCH_DTYPE(G, FP8)                                                                             \
    CUDA_CHECK(launch_kernel(attention_decode_kernel<G, OutT, FP8, PREPARED>, grid, dim3(THREADS), 0, s, pdl, qkv, out, kv, \
                             block_tables, table_start, context_lens, q_norm, k_norm, rope_cos, rope_sin, eps,    \
                             n_heads, scale_log2, n_splits, ws_acc, ws_stats, counters))
#define LAUNCH(G)                                                                                        \
    do {                                                                                                 \
        if (kv.dtype == KITE_KV_CACHE_FP8) LAUNCH_DTYPE(G, true);                                        \
        else LAUNCH_DTYPE(G, false);                                                                     \
    } while (0)
    switch (group) {
    case 4: LAUNCH(4); break;
    case 2: LAUNCH(2); break;
    default: LAUNCH(1); break;
    }
#undef LAUNCH
#undef LAUNCH_DTYPE
    return KITE_OK;
}

} // namespace

extern "C" kite_status cuda_attention_decode(const float *qkv, float *out, cuda_kv_layer kv, const int32_t *block_table,
                                             const int32_t *context_len, const float *q_norm, const float *k_norm,
                                             const float *rope_cos, const float *rope_sin, float eps, int n_heads,
                                             float scale, int n_splits, void *workspace, unsigned *counters,
                                             void *stream, int use_pdl) {
    return attention_decode_launch<float, false>(qkv, out, kv, block_table, NULL, context_len, q_norm, k_norm, rope_cos,
                                          rope_sin, eps, n_heads, scale, 1, n_splits, workspace, counters, stream,
                                          use_pdl);
}

extern "C" kite_status cuda_attention_decode_rows(const float *qkv, void *out, int out_bf16, cuda_kv_layer kv,
                                                  const int32_t *block_tables, const int32_t *table_start,
                                                  const int32_t *context_lens, const float *q_norm,
                                                  const float *k_norm, const float *rope_cos, const float *rope_sin,
                                                  float eps, int n_heads, float scale, int n_seqs, int n_splits,
                                                  void *workspace, unsigned *counters, void *stream, int use_pdl) {
    if (out_bf16)
        return attention_decode_launch<bf16, false>(qkv, static_cast<bf16 *>(out), kv, block_tables, table_start, context_lens,
                                             q_norm, k_norm, rope_cos, rope_sin, eps, n_heads, scale, n_seqs, n_splits,
                                             workspace, counters, stream, use_pdl);
    return attention_decode_launch<float, false>(qkv, static_cast<float *>(out), kv, block_tables, table_start, context_lens,
                                          q_norm, k_norm, rope_cos, rope_sin, eps, n_heads, scale, n_seqs, n_splits,
                                          workspace, counters, stream, use_pdl);
}

extern "C" kite_status cuda_attention_decode_prepared(const void *q, void *out, cuda_kv_layer kv,
                                                      const int32_t *block_tables, const int32_t *table_start,
                                                      const int32_t *context_lens, int n_heads, float scale,
                                                      int n_seqs, int n_splits, void *workspace, unsigned *counters,
                                                      void *stream) {
    return attention_decode_launch<bf16, true>(q, static_cast<bf16 *>(out), kv, block_tables, table_start,
                                               context_lens, NULL, NULL, NULL, NULL, 0.0f, n_heads, scale, n_seqs,
                                               n_splits, workspace, counters, stream, 0);
}

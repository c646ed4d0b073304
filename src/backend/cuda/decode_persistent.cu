/* Single-stream decode as one persistent kernel: the whole token (embedding, every layer, lm_head and
 * argmax) in one launch of one block per SM.
 *
 * Why: as separate kernels each of the 5 steps of a layer paid ~4 us of fixed cost (launch, PDL wait,
 * prologue, one round of loads, reductions) on top of 1-3 us of weight traffic (docs/notes-cuda.md). Here
 * the steps of a layer are stages separated by grid-wide counters instead of kernel boundaries, and a warp
 * that has finished its share of a stage starts the bulk copies of its weights (or K/V rows) for the next
 * stage into shared memory before it waits for the other blocks: the weight stream overlaps the boundary.
 *
 * Status (H200, docs/notes-cuda.md "Persistent decode"): exact against the graph path (rel L2 < 1e-4) but
 * not faster yet, 0.87 ms/token at depth 256 against the graph's 0.81, so it is opt-in. Measured cost of a
 * stage boundary: 1.2 us for the counter barrier + 0.5 us to stage the input, ~8.5 us per layer before any
 * weight moves.
 *
 * Stages of a layer (each ends with every block incrementing the stage's counter; the next stage starts
 * when the counter reaches the grid size):
 *   QKV     rmsnorm(x) . W_qkv                      -> qkv        (rows spread over every warp)
 *   ATTN    q/k norm + RoPE, K/V append, split-K attention over the paged cache -> attention
 *   O       x += attention . W_o
 *   GATEUP  silu(rmsnorm(x) . W_gate) * (rmsnorm(x) . W_up) -> act
 *   DOWN    x += act . W_down
 * then LM_HEAD: rmsnorm(x) . W_lm -> logits, argmax partials per block; the last block to finish reduces
 * them to the token id and zeroes every counter for the next launch.
 *
 * Memory rules inside one launch: activations (x, qkv, attention, act, partials) are written by one SM and
 * read by others, and the same addresses are reused by every layer, so they are read with ld.global.cg
 * (L2, never a stale L1 line) and written with st.global.cg. Weights and the step values never change
 * during a launch and take the read-only path. The grid must be co-resident (the counters are spin-waited):
 * it is launched as a cooperative kernel of one block per SM, which the driver refuses otherwise; a wait
 * that exceeds ~10 s traps instead of hanging. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/decode_attention.cuh"
#include "backend/cuda/gemv_task.cuh"
#include "backend/cuda/grid_barrier.cuh"

#include <float.h>

namespace {

constexpr int THREADS = 256; /* one block per SM (8 warps, each with its own weight slots) */
constexpr int WARPS = THREADS / 32;
constexpr int HEAD_DIM = DECODE_HEAD_DIM;
constexpr int STAGES_PER_LAYER = 5;
constexpr int ATT_MIN_CHUNK = 64;        /* positions per block at least: one round of loads at short context */
constexpr int ATT_GROUP_MAX = 2;         /* query heads per attention unit */

/* ---- the kernel's arguments ------------------------------------------------------------------------ */

struct workspace_layout {
    unsigned *counters;         /* n_layers * STAGES_PER_LAYER stage counters, 1 final, n_layers * n_heads unit counters */
    float *att_acc;             /* [n_blocks][ATT_GROUP_MAX][HEAD_DIM] per-block attention partials */
    float2 *att_stats;          /* [n_blocks][ATT_GROUP_MAX] (max, sum) of each partial */
    argmax_entry *argmax;       /* [n_blocks] */
    unsigned *unit_counters;    /* = counters + n_layers * STAGES_PER_LAYER + 1 */
    int n_counters;
    size_t bytes;               /* the whole workspace */
};

__host__ __device__ size_t align256(size_t n) { return (n + 255) / 256 * 256; }

/* The parts of the workspace at `base` (each 256-byte aligned) and its size. */
__host__ __device__ workspace_layout carve_workspace(const cuda_decode_args &a, int n_blocks, uintptr_t base) {
    workspace_layout w;
    size_t offset = 0;
    w.n_counters = (int)((size_t)a.n_layers * STAGES_PER_LAYER + 1 + (size_t)a.n_layers * (size_t)a.n_heads);
    w.counters = reinterpret_cast<unsigned *>(base + offset);
    w.unit_counters = w.counters + (size_t)a.n_layers * STAGES_PER_LAYER + 1;
    offset += align256((size_t)w.n_counters * sizeof(unsigned));
    w.att_acc = reinterpret_cast<float *>(base + offset);
    offset += align256((size_t)n_blocks * ATT_GROUP_MAX * HEAD_DIM * sizeof(float));
    w.att_stats = reinterpret_cast<float2 *>(base + offset);
    offset += align256((size_t)n_blocks * ATT_GROUP_MAX * sizeof(float2));
    w.argmax = reinterpret_cast<argmax_entry *>(base + offset);
    offset += align256((size_t)n_blocks * sizeof(argmax_entry));
    w.bytes = offset;
    return w;
}

__host__ __device__ workspace_layout carve_workspace(const cuda_decode_args &a, int n_blocks) {
    return carve_workspace(a, n_blocks, reinterpret_cast<uintptr_t>(a.workspace));
}

/* ---- stage inputs ------------------------------------------------------------------------------------ */

/* smem_x[0:n] = src (fp32, written in this launch), times rsqrt(mean(src^2) + eps) * norm when norm != NULL. */
__device__ void stage_vector(float *smem_x, const float *src, const float *__restrict__ norm, float eps, int n,
                             float *scratch) {
    const float4 *src4 = reinterpret_cast<const float4 *>(src);
    float4 *x4 = reinterpret_cast<float4 *>(smem_x);
    float sum_sq = 0.0f;
    for (int i = threadIdx.x; i < n / 4; i += THREADS) {
        const float4 v = __ldcg(src4 + i);
        x4[i] = v;
        sum_sq += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    if (norm != nullptr) {
        const float scale = rsqrtf(block_sum(sum_sq, scratch) / (float)n + eps);
        for (int i = threadIdx.x; i < n / 4; i += THREADS) {
            float4 v = x4[i];
            const float4 g = reinterpret_cast<const float4 *>(norm)[i];
            v.x *= scale * g.x;
            v.y *= scale * g.y;
            v.z *= scale * g.z;
            v.w *= scale * g.w;
            x4[i] = v;
        }
    }
    __syncthreads();
}

/* Layer 0's input: the token's embedding row, normalised into smem; block 0 also writes it to x as the
 * start of the residual stream. */
__device__ void stage_embedding(float *smem_x, const bf16 *__restrict__ embed, int32_t token, float *x,
                                const float *__restrict__ norm, float eps, int n, float *scratch) {
    const uint4 *row = reinterpret_cast<const uint4 *>(embed + (size_t)token * (size_t)n);
    float sum_sq = 0.0f;
    for (int i = threadIdx.x; i < n / 8; i += THREADS) {
        float v[8];
        bf16x8_to_float(__ldg(row + i), v);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            smem_x[8 * i + j] = v[j];
            sum_sq += v[j] * v[j];
        }
        if (blockIdx.x == 0) {
            __stcg(reinterpret_cast<float4 *>(x) + 2 * i, make_float4(v[0], v[1], v[2], v[3]));
            __stcg(reinterpret_cast<float4 *>(x) + 2 * i + 1, make_float4(v[4], v[5], v[6], v[7]));
        }
    }
    const float scale = rsqrtf(block_sum(sum_sq, scratch) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += THREADS) smem_x[i] *= scale * norm[i];
    __syncthreads();
}

/* ---- weight streaming: per-warp rings of shared-memory slots filled by bulk copies -------------------
 * Each warp owns n_slots slots of SLOT_BYTES (each with an mbarrier) and streams its weight rows through
 * them with cp.async.bulk (the copy engine; no registers held while the bytes are in flight). A stage
 * issues its first units (up to n_slots) before it waits for the stage before, so the weight stream runs
 * under the grid-wide wait; each consumed unit frees its slot for the unit n_slots ahead. The counters of
 * issued and consumed units run on across stages and layers (slot = count % n_slots, parity =
 * (count / n_slots) & 1). */
constexpr int SLOT_BYTES = 8192;
constexpr int MAX_SLOTS = 4;

struct pipe_state {
    uint32_t issued, consumed;
    int n_slots;
    unsigned char *slots; /* this warp's n_slots * SLOT_BYTES of shared memory */
    uint64_t *bars;       /* this warp's n_slots mbarriers */
};

/* ---- matrix-vector stages ---------------------------------------------------------------------------
 * A warp owns R weight rows at a time (a task); tasks are spread over every warp of the grid. A task's rows
 * arrive in units of at most SLOT_BYTES (R rows x a range of columns; a long row takes several units) and
 * are reduced against the stage input staged in shared memory as fp32. EPILOGUE is a CUDA_GEMV_* value. */
template <int R, int EPILOGUE>
struct matvec_pipe {
    gemv_task_rows<R, EPILOGUE> layout; /* task -> rows (gemv_task.cuh) */
    const bf16 *weight;
    int cols, n_tasks, first_task, task_stride, chunk_cols, passes, n_units, next_unit;

    /* Unit u of this warp: task first_task + (u / passes) * task_stride, columns of pass u % passes. */
    __device__ __forceinline__ void issue(pipe_state &pipe, int u) {
        const int lane = threadIdx.x & 31;
        const int task = first_task + (u / passes) * task_stride;
        const int c0 = (u % passes) * chunk_cols;
        const int width = min(chunk_cols, cols - c0);
        const int slot = (int)(pipe.issued % (uint32_t)pipe.n_slots);
        uint64_t *bar = &pipe.bars[slot];
        int n_valid = 0;
#pragma unroll
        for (int r = 0; r < R; r++) n_valid += layout.valid(task, r) ? 1 : 0;
        if (lane == 0) {
            /* The slot's previous contents were read through the generic proxy; the copy writes through the
             * async proxy. */
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            mbar_expect_tx(bar, (unsigned)(n_valid * width * 2));
        }
        __syncwarp();
        if (lane < R && layout.valid(task, lane)) {
            const bf16 *src = weight + (size_t)layout.row_of(task, lane) * (size_t)cols + c0;
            bulk_copy_to_smem(pipe.slots + (size_t)slot * SLOT_BYTES + (size_t)lane * chunk_cols * 2, src,
                              (unsigned)(width * 2), bar);
        }
        pipe.issued++;
    }

    /* Before the stage's wait: this warp's task list and its first units. */
    __device__ __forceinline__ void prefetch(pipe_state &pipe, const void *weight_, int rows_, int cols_) {
        weight = static_cast<const bf16 *>(weight_);
        layout.init(rows_);
        cols = cols_;
        n_tasks = layout.n_tasks();
        first_task = blockIdx.x * WARPS + (threadIdx.x >> 5);
        task_stride = gridDim.x * WARPS;
        chunk_cols = min(cols, (SLOT_BYTES / (2 * R)) & ~7);
        passes = (cols + chunk_cols - 1) / chunk_cols;
        const int my_tasks = first_task < n_tasks ? (n_tasks - 1 - first_task) / task_stride + 1 : 0;
        n_units = my_tasks * passes;
        for (next_unit = 0; next_unit < n_units && next_unit < pipe.n_slots; next_unit++) issue(pipe, next_unit);
    }

    /* x: the stage input in shared memory (cols floats). ARGMAX tracks (best, best_index) in lane 0. */
    __device__ __forceinline__ void run(pipe_state &pipe, const float *x, float *y, float &best, int32_t &best_index) {
        const int lane = threadIdx.x & 31;
        const float4 *x4 = reinterpret_cast<const float4 *>(x);
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = 0.0f;
        for (int u = 0; u < n_units; u++) {
            const int task = first_task + (u / passes) * task_stride, pass = u % passes;
            const int c0 = pass * chunk_cols, width = min(chunk_cols, cols - c0);
            const int slot = (int)(pipe.consumed % (uint32_t)pipe.n_slots);
            mbar_wait(&pipe.bars[slot], (pipe.consumed / (uint32_t)pipe.n_slots) & 1u);
            const uint4 *w = reinterpret_cast<const uint4 *>(pipe.slots + (size_t)slot * SLOT_BYTES);
            for (int j = lane; j < (width >> 3); j += 32) {
                const int c = (c0 >> 3) + j;
                const float4 x0 = x4[2 * c], x1 = x4[2 * c + 1];
#pragma unroll
                for (int r = 0; r < R; r++) acc[r] += chunk_dot(w[r * (chunk_cols >> 3) + j], x0, x1);
            }
            __syncwarp(); /* every lane is done with the slot */
            pipe.consumed++;
            if (next_unit < n_units) issue(pipe, next_unit++);
            if (pass != passes - 1) continue;

#pragma unroll
            for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
            if (lane == 0) layout.template store<true>(task, acc, y, best, best_index);
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] = 0.0f;
        }
    }
};

/* ---- the attention stage ----------------------------------------------------------------------------
 * Attention units of GROUP query heads sharing one kv head (n_kv_heads * head_groups of them); each unit's
 * context is split over `blocks_per_unit` blocks (ranges of a multiple of 16 positions, at least
 * ATT_MIN_CHUNK, so a short context uses few blocks). Inside a block the range is cut into pieces of 16
 * positions (the K rows of one kv head and 16 consecutive slots of a cache block are contiguous, 4 KB, and
 * so are the V rows): warp w takes pieces w, w + 8, ..., each arriving in one weight slot by two bulk
 * copies, issued before the stage's wait (old cache rows do not depend on this step). In a warp 4 streams
 * of 8 lanes take positions s, s + 4, ... of a piece; lane j of a stream holds dims stream_dim(j, 0 .. 15).
 * The new position's K/V is appended after the wait and folded in from global memory by the block that
 * holds it (its slot may have been copied before it was written). Streams merge by shuffles, warps through
 * shared memory, blocks through the workspace in the last block of the unit to finish (a per-layer,
 * per-unit counter). Needs a cache block size that is a multiple of 16. */
constexpr int ATT_PIECE = 16; /* positions per piece: K + V of one kv head = 2 x 4 KB = SLOT_BYTES */

struct __align__(16) attention_smem { /* q is read as float4 */
    float q[ATT_GROUP_MAX][HEAD_DIM];
    warp_partials<WARPS, ATT_GROUP_MAX> partials;
    bool is_last;
};

/* RMSNorm (* weight) and RoPE (rotate-half) of one 128-value head held by a warp: lane l holds dims 2l,
 * 2l + 1, 64 + 2l, 65 + 2l. src was written in this launch (read through L2). */
__device__ __forceinline__ void norm_rope_head(const float *src, const float *__restrict__ weight, float2 c, float2 s,
                                               float eps, int lane, float out[4]) {
    const int d0 = 2 * lane, d1 = HEAD_DIM / 2 + 2 * lane;
    const float w[4] = {weight[d0], weight[d0 + 1], weight[d1], weight[d1 + 1]};
    norm_rope_lane(__ldcg(reinterpret_cast<const float2 *>(src + d0)), __ldcg(reinterpret_cast<const float2 *>(src + d1)),
                   w, c, s, eps, out);
}

/* Folds one position (K and V rows, 16 dims per lane as two uint4 each) into a stream's online softmax;
 * every lane of the warp calls it (the dot product is reduced over the 8 lanes of the stream). */
template <int GROUP>
__device__ __forceinline__ void attend_position(const uint4 k0, const uint4 k1, const uint4 v0, const uint4 v1, bool valid,
                                                const attention_smem &sm, int sub, float m[GROUP], float l[GROUP],
                                                float acc[GROUP][16]) {
    float kf[16];
    bf16x8_to_float(k0, kf);
    bf16x8_to_float(k1, kf + 8);
    float s[GROUP];
#pragma unroll
    for (int g = 0; g < GROUP; g++) {
        const float4 *q_lo = reinterpret_cast<const float4 *>(&sm.q[g][stream_dim(sub, 0)]);
        const float4 *q_hi = reinterpret_cast<const float4 *>(&sm.q[g][stream_dim(sub, 8)]);
        float d = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float4 q = i < 2 ? q_lo[i] : q_hi[i - 2];
            d += q.x * kf[4 * i] + q.y * kf[4 * i + 1] + q.z * kf[4 * i + 2] + q.w * kf[4 * i + 3];
        }
        d += __shfl_xor_sync(0xffffffffu, d, 1);
        d += __shfl_xor_sync(0xffffffffu, d, 2);
        d += __shfl_xor_sync(0xffffffffu, d, 4);
        s[g] = d;
    }
    if (!valid) return;
    float vf[16];
    bf16x8_to_float(v0, vf);
    bf16x8_to_float(v1, vf + 8);
    online_softmax_add<GROUP>(m, l, acc, s, vf);
}

template <int GROUP>
struct attention_stage {
    cuda_kv_layer kv;
    const int32_t *table;
    int ctx, position, group_heads, head_groups, n_units, blocks_per_unit, n_items;
    /* this block's item (unit, split) and range; this warp's pieces */
    int unit, split, n_used, begin, end, first_piece, n_pieces, next_piece;

    __device__ __forceinline__ const bf16 *row(int p, int kind, int kv_head) const {
        const int32_t block = table[p / kv.block_size], slot = p % kv.block_size;
        return static_cast<const bf16 *>(kv.base) + kv_offset(kv, block, kind, kv_head, slot);
    }

    /* Piece i of this warp: positions [p0, p0 + 16) of the block's range, K then V into one slot. */
    __device__ __forceinline__ void issue(pipe_state &pipe, int i) {
        const int lane = threadIdx.x & 31;
        const int p0 = begin + (first_piece + i * WARPS) * ATT_PIECE;
        const int n = min(ATT_PIECE, end - p0);
        const int slot = (int)(pipe.issued % (uint32_t)pipe.n_slots);
        uint64_t *bar = &pipe.bars[slot];
        const unsigned bytes = (unsigned)(n * HEAD_DIM * 2);
        if (lane == 0) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            mbar_expect_tx(bar, 2 * bytes);
        }
        __syncwarp();
        if (lane < 2) {
            const int kv_head = unit / head_groups;
            bulk_copy_to_smem(pipe.slots + (size_t)slot * SLOT_BYTES + (size_t)lane * (SLOT_BYTES / 2), row(p0, lane, kv_head),
                              bytes, bar);
        }
        pipe.issued++;
    }

    __device__ __forceinline__ void prefetch(pipe_state &pipe, cuda_kv_layer kv_, const int32_t *table_, int ctx_,
                                             int n_heads) {
        kv = kv_;
        table = table_;
        ctx = ctx_;
        position = ctx - 1;
        group_heads = n_heads / kv.n_kv_heads;
        head_groups = group_heads / GROUP;
        n_units = kv.n_kv_heads * head_groups;
        blocks_per_unit = max(1, (int)gridDim.x / n_units);
        n_items = n_units * blocks_per_unit;
        const int item = blockIdx.x;
        unit = item / blocks_per_unit;
        split = item % blocks_per_unit;
        int chunk = (ctx + blocks_per_unit - 1) / blocks_per_unit;
        if (chunk < ATT_MIN_CHUNK) chunk = ATT_MIN_CHUNK;
        chunk = (chunk + ATT_PIECE - 1) / ATT_PIECE * ATT_PIECE;
        n_used = (ctx + chunk - 1) / chunk;
        begin = split * chunk;
        end = min(ctx, begin + chunk);
        first_piece = threadIdx.x >> 5;
        n_pieces = 0;
        if (item < n_items && split < n_used) {
            const int pieces = (end - begin + ATT_PIECE - 1) / ATT_PIECE;
            n_pieces = first_piece < pieces ? (pieces - 1 - first_piece) / WARPS + 1 : 0;
        }
        for (next_piece = 0; next_piece < n_pieces && next_piece < pipe.n_slots; next_piece++) issue(pipe, next_piece);
    }

    __device__ void run(pipe_state &pipe, const float *qkv, float *out, const float *__restrict__ q_norm,
                        const float *__restrict__ k_norm, const float *__restrict__ rope_cos,
                        const float *__restrict__ rope_sin, float eps, float scale_log2, int n_heads,
                        const workspace_layout &ws, unsigned *unit_counters, attention_smem &sm) {
        if (blockIdx.x >= n_items || split >= n_used) return; /* uniform over the block */
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane & 7, stream = lane >> 3;
        const float2 rc = __ldg(reinterpret_cast<const float2 *>(rope_cos + (size_t)position * (HEAD_DIM / 2) + 2 * lane));
        const float2 rs = __ldg(reinterpret_cast<const float2 *>(rope_sin + (size_t)position * (HEAD_DIM / 2) + 2 * lane));
        const int kv_head = unit / head_groups;
        const int first_head = kv_head * group_heads + (unit % head_groups) * GROUP;

        /* The query heads, and in the block that holds the new position its K and V. */
        const bool owns_new = begin <= position && position < end;
        for (int w = warp; w < GROUP + 2; w += WARPS) {
            if (w < GROUP) {
                float v[4];
                norm_rope_head(qkv + (size_t)(first_head + w) * HEAD_DIM, q_norm, rc, rs, eps, lane, v);
                sm.q[w][2 * lane] = v[0] * scale_log2;
                sm.q[w][2 * lane + 1] = v[1] * scale_log2;
                sm.q[w][HEAD_DIM / 2 + 2 * lane] = v[2] * scale_log2;
                sm.q[w][HEAD_DIM / 2 + 2 * lane + 1] = v[3] * scale_log2;
            } else if (owns_new) {
                const int kind = w - GROUP; /* 0: K, 1: V */
                const float *src = qkv + (size_t)(n_heads + kind * kv.n_kv_heads + kv_head) * HEAD_DIM;
                bf16 *dst = const_cast<bf16 *>(row(position, kind, kv_head));
                float v[4];
                if (kind == 0) {
                    norm_rope_head(src, k_norm, rc, rs, eps, lane, v);
                } else {
                    const float2 lo = __ldcg(reinterpret_cast<const float2 *>(src + 2 * lane));
                    const float2 hi = __ldcg(reinterpret_cast<const float2 *>(src + HEAD_DIM / 2 + 2 * lane));
                    v[0] = lo.x;
                    v[1] = lo.y;
                    v[2] = hi.x;
                    v[3] = hi.y;
                }
                *reinterpret_cast<uint32_t *>(dst + 2 * lane) = pack_bf16x2(v[0], v[1]);
                *reinterpret_cast<uint32_t *>(dst + HEAD_DIM / 2 + 2 * lane) = pack_bf16x2(v[2], v[3]);
            }
        }
        __syncthreads(); /* sm.q ready; the new K/V row is in global memory for this block's reads */

        float m[GROUP], l[GROUP], acc[GROUP][16];
        stream_init<GROUP>(m, l, acc);
        for (int i = 0; i < n_pieces; i++) {
            const int p0 = begin + (first_piece + i * WARPS) * ATT_PIECE;
            const int slot = (int)(pipe.consumed % (uint32_t)pipe.n_slots);
            mbar_wait(&pipe.bars[slot], (pipe.consumed / (uint32_t)pipe.n_slots) & 1u);
            const uint4 *k_rows = reinterpret_cast<const uint4 *>(pipe.slots + (size_t)slot * SLOT_BYTES);
            const uint4 *v_rows = k_rows + SLOT_BYTES / 2 / 16;
#pragma unroll
            for (int j = 0; j < ATT_PIECE / 4; j++) {
                const int q = stream + 4 * j, p = p0 + q;
                const bool valid = p < end && p != position; /* the new position: folded in below */
                const int r = valid ? q : 0;
                attend_position<GROUP>(k_rows[r * 16 + sub], k_rows[r * 16 + sub + 8], v_rows[r * 16 + sub],
                                       v_rows[r * 16 + sub + 8], valid, sm, sub, m, l, acc);
            }
            __syncwarp();
            pipe.consumed++;
            if (next_piece < n_pieces) issue(pipe, next_piece++);
        }
        if (owns_new && warp == 0) { /* stream 0 of warp 0 takes the new position from global memory */
            const uint4 *k_new = reinterpret_cast<const uint4 *>(row(position, 0, kv_head)) + sub;
            const uint4 *v_new = reinterpret_cast<const uint4 *>(row(position, 1, kv_head)) + sub;
            const bool mine = stream == 0;
            attend_position<GROUP>(mine ? __ldcg(k_new) : make_uint4(0, 0, 0, 0), mine ? __ldcg(k_new + 8) : make_uint4(0, 0, 0, 0),
                                   mine ? __ldcg(v_new) : make_uint4(0, 0, 0, 0), mine ? __ldcg(v_new + 8) : make_uint4(0, 0, 0, 0),
                                   mine, sm, sub, m, l, acc);
        }

        /* Merge the 4 streams of each warp, then the warps in shared memory. */
        merge_warp_streams<GROUP>(m, l, acc);
        sm.partials.template store<GROUP>(warp, lane, m, l, acc);
        __syncthreads();

        /* This block's result per head: thread t < GROUP * 128 owns head t / 128, dim t % 128. */
        const int t = threadIdx.x, g = t / HEAD_DIM, d = t % HEAD_DIM;
        const int partial = blockIdx.x; /* < n_items <= gridDim.x */
        if (g < GROUP) {
            float m_all, l_all, a_all;
            sm.partials.merge(g, d, m_all, l_all, a_all);
            if (n_used == 1) {
                __stcg(&out[(size_t)(first_head + g) * HEAD_DIM + d], a_all / l_all);
            } else {
                __stcg(&ws.att_acc[((size_t)partial * ATT_GROUP_MAX + g) * HEAD_DIM + d], a_all);
                if (d == 0) __stcg(&ws.att_stats[(size_t)partial * ATT_GROUP_MAX + g], make_float2(m_all, l_all));
            }
        }
        if (n_used == 1) return;
        /* The last block of this unit to finish combines the unit's partials. */
        if (!block_arrive_is_last(&unit_counters[unit], (unsigned)n_used, &sm.is_last)) return;
        if (g < GROUP) {
            const int first_partial = unit * blocks_per_unit;
            float m_all = DECODE_NO_SCORE;
            for (int sp = 0; sp < n_used; sp++)
                m_all = fmaxf(m_all, __ldcg(&ws.att_stats[(size_t)(first_partial + sp) * ATT_GROUP_MAX + g]).x);
            float l_all = 0.0f, a_all = 0.0f;
            for (int sp = 0; sp < n_used; sp++) {
                const size_t index = (size_t)(first_partial + sp) * ATT_GROUP_MAX + g;
                const float2 st = __ldcg(&ws.att_stats[index]);
                const float f = exp2f(st.x - m_all);
                l_all += st.y * f;
                a_all += __ldcg(&ws.att_acc[index * HEAD_DIM + d]) * f;
            }
            __stcg(&out[(size_t)(first_head + g) * HEAD_DIM + d], a_all / l_all);
        }
    }
};

/* ---- the kernel -------------------------------------------------------------------------------------
 * The arguments are a kernel parameter (constant bank: free to re-read, so nothing about the model has to
 * stay in registers across stages); the stages are inlined (as separate functions, the calls inside the
 * layer loop made ptxas spill, and a reference to the parameter struct copies it to local memory). Stage
 * g = layer * STAGES_PER_LAYER + s waits for counter g - 1 and arrives at counter g; the lm_head is stage
 * n_layers * STAGES_PER_LAYER.
 * Dynamic shared memory: the stage input (the widest of hidden, n_heads * 128 and intermediate, fp32), then
 * every warp's weight slots (WARPS x n_slots x SLOT_BYTES). */

enum { STAGE_QKV = 0, STAGE_ATTN = 1, STAGE_O = 2, STAGE_GATE_UP = 3, STAGE_DOWN = 4 };

__host__ __device__ __forceinline__ size_t input_bytes(const cuda_decode_args &a) {
    int widest = a.hidden;
    if (a.intermediate > widest) widest = a.intermediate;
    if (a.n_heads * HEAD_DIM > widest) widest = a.n_heads * HEAD_DIM;
    return ((size_t)widest * sizeof(float) + 127) / 128 * 128;
}

/* One matrix-vector stage: issue this warp's first weight units, wait for the stage before, stage the input
 * vector in shared memory, run, arrive. */
template <int STAGE, int R, int EPILOGUE>
__device__ __forceinline__ void matvec_stage(const cuda_decode_args &a, int layer, pipe_state &pipe) {
    extern __shared__ __align__(128) float4 smem_dynamic[];
    __shared__ float scratch[32];
    float *smem_x = reinterpret_cast<float *>(smem_dynamic);
    const cuda_decode_layer &L = a.layers[layer];
    const workspace_layout ws = carve_workspace(a, gridDim.x);
    const int g = layer * STAGES_PER_LAYER + STAGE;
    const int q_dim = a.n_heads * HEAD_DIM;
    const void *weight = STAGE == STAGE_QKV ? L.qkv : STAGE == STAGE_O ? L.o : STAGE == STAGE_GATE_UP ? L.gate_up : L.down;
    const int rows = STAGE == STAGE_QKV       ? (a.n_heads + 2 * a.n_kv_heads) * HEAD_DIM
                     : STAGE == STAGE_GATE_UP ? 2 * a.intermediate
                                              : a.hidden;
    const int cols = STAGE == STAGE_O ? q_dim : STAGE == STAGE_DOWN ? a.intermediate : a.hidden;
    const float *src = STAGE == STAGE_O ? a.attention : STAGE == STAGE_DOWN ? a.act : a.x;
    const float *norm = STAGE == STAGE_QKV ? L.input_norm : STAGE == STAGE_GATE_UP ? L.post_norm : nullptr;
    float *y = STAGE == STAGE_QKV ? a.qkv : STAGE == STAGE_GATE_UP ? a.act : a.x;

    matvec_pipe<R, EPILOGUE> stage;
    stage.prefetch(pipe, weight, rows, cols);
    if (g == 0) { /* layer 0's input is the token's embedding */
        stage_embedding(smem_x, static_cast<const bf16 *>(a.embed), __ldg(a.token), a.x, norm, a.eps, cols, scratch);
    } else {
        stage_wait(&ws.counters[g - 1]);
        stage_vector(smem_x, src, norm, a.eps, cols, scratch);
    }
    float unused_best = 0.0f;
    int32_t unused_index = 0;
    stage.run(pipe, smem_x, y, unused_best, unused_index);
    stage_arrive(&ws.counters[g]);
}

template <int GROUP>
__device__ __forceinline__ void attention_step(const cuda_decode_args &a, int layer, pipe_state &pipe) {
    __shared__ attention_smem att_smem;
    const cuda_decode_layer &L = a.layers[layer];
    const workspace_layout ws = carve_workspace(a, gridDim.x);
    const int g = layer * STAGES_PER_LAYER + STAGE_ATTN;
    const cuda_kv_layer kv = {static_cast<bf16 *>(a.kv_cache) + (size_t)layer * a.kv_layer_elements, a.kv_block_size,
                              a.n_kv_heads, HEAD_DIM};
    const float scale_log2 = rsqrtf((float)HEAD_DIM) * 1.4426950408889634f;
    attention_stage<GROUP> stage;
    stage.prefetch(pipe, kv, a.block_table, __ldg(a.context_len), a.n_heads);
    stage_wait(&ws.counters[g - 1]);
    stage.run(pipe, a.qkv, a.attention, L.q_norm, L.k_norm, a.rope_cos, a.rope_sin, a.eps, scale_log2, a.n_heads, ws,
              ws.unit_counters + (size_t)layer * a.n_heads, att_smem);
    stage_arrive(&ws.counters[g]);
}

/* The lm_head with the argmax: logits, per-block partials; the last block to arrive reduces them to the
 * token id and zeroes every counter (all blocks are past their last wait by then). */
template <int R>
__device__ __forceinline__ void lm_head_stage(const cuda_decode_args &a, pipe_state &pipe) {
    extern __shared__ __align__(128) float4 smem_dynamic[];
    __shared__ float scratch[32];
    __shared__ argmax_entry warp_best[WARPS];
    __shared__ bool is_last;
    float *smem_x = reinterpret_cast<float *>(smem_dynamic);
    const workspace_layout ws = carve_workspace(a, gridDim.x);
    const int g = a.n_layers * STAGES_PER_LAYER;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    matvec_pipe<R, CUDA_GEMV_ARGMAX> stage;
    stage.prefetch(pipe, a.lm_head, a.vocab, a.hidden);
    stage_wait(&ws.counters[g - 1]);
    stage_vector(smem_x, a.x, a.final_norm, a.eps, a.hidden, scratch);
    float best = -FLT_MAX;
    int32_t best_index = INT32_MAX;
    stage.run(pipe, smem_x, a.logits, best, best_index);
    if (lane == 0) warp_best[warp] = argmax_entry{best, best_index};
    __syncthreads();
    if (threadIdx.x == 0) {
        argmax_entry block_best = warp_best[0];
        for (int w = 1; w < WARPS; w++)
            if (argmax_better(warp_best[w].value, warp_best[w].index, block_best.value, block_best.index))
                block_best = warp_best[w];
        __stcg(&ws.argmax[blockIdx.x].value, block_best.value);
        __stcg(&ws.argmax[blockIdx.x].index, block_best.index);
        __threadfence();
        is_last = atomicAdd(&ws.counters[g], 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!is_last) return;

    __threadfence();
    if (warp == 0) {
        argmax_entry b = argmax_none();
        for (int i = lane; i < (int)gridDim.x; i += 32) {
            const argmax_entry e{__ldcg(&ws.argmax[i].value), __ldcg(&ws.argmax[i].index)};
            if (argmax_better(e.value, e.index, b.value, b.index)) b = e;
        }
        b = warp_argmax(b);
        if (lane == 0) *a.token_out = argmax_id(b);
    }
    for (int i = threadIdx.x; i < ws.n_counters; i += THREADS) ws.counters[i] = 0;
}

/* Rows per warp task: one 8 KB unit per task for the 0.6B shape (QKV 4 rows of 2 KB, o 1 row of 4 KB,
 * gate/up 2 outputs = 4 rows, down 1 row of 6 KB); a QKV, o and down task per warp (1024 tasks, 1056 warps). */
template <int GROUP>
__global__ void __launch_bounds__(THREADS, 1) decode_persistent_kernel(const cuda_decode_args a) {
    /* 128-byte aligned, as every declaration of it (scripts/kernel_footprint.sh says why): after the 10,080 bytes of
     * static shared memory the slots started 96 bytes past a boundary; aligned, the step is 3.2 / 4.0% faster at
     * depths 256 / 16,384 (s25r1). */
    extern __shared__ __align__(128) float4 smem_dynamic[];
    __shared__ uint64_t slot_bars[WARPS][MAX_SLOTS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    pipe_state pipe;
    pipe.issued = pipe.consumed = 0;
    pipe.n_slots = a.n_slots;
    pipe.slots = reinterpret_cast<unsigned char *>(smem_dynamic) + input_bytes(a) +
                 (size_t)warp * (size_t)a.n_slots * SLOT_BYTES;
    pipe.bars = slot_bars[warp];
    if (lane == 0)
        for (int i = 0; i < a.n_slots; i++) mbar_init(&pipe.bars[i], 1);
    mbar_init_fence();
    __syncthreads();

    const int n_layers = a.n_layers;
    for (int layer = 0; layer < n_layers; layer++) {
        matvec_stage<STAGE_QKV, 4, CUDA_GEMV_STORE>(a, layer, pipe);     /* qkv = rmsnorm(x) . W_qkv */
        attention_step<GROUP>(a, layer, pipe);                                 /* attention */
        matvec_stage<STAGE_O, 1, CUDA_GEMV_ADD>(a, layer, pipe);         /* x += attention . W_o */
        matvec_stage<STAGE_GATE_UP, 4, CUDA_GEMV_SWIGLU>(a, layer, pipe); /* act = SwiGLU */
        matvec_stage<STAGE_DOWN, 1, CUDA_GEMV_ADD>(a, layer, pipe);      /* x += act . W_down */
    }
    lm_head_stage<4>(a, pipe);
}

typedef void (*kernel_fn)(const cuda_decode_args);

kernel_fn pick_kernel(const cuda_decode_args &a) {
    const int group_heads = a.n_heads / a.n_kv_heads;
    return group_heads % 2 == 0 ? decode_persistent_kernel<2> : decode_persistent_kernel<1>;
}

size_t dynamic_smem(const cuda_decode_args &a) {
    return input_bytes(a) + (size_t)WARPS * (size_t)a.n_slots * SLOT_BYTES;
}

} // namespace

extern "C" kite_status cuda_decode_persistent_plan(cuda_decode_args *a, int *n_blocks, size_t *workspace) {
    const int group_heads = a->n_kv_heads > 0 ? a->n_heads / a->n_kv_heads : 0;
    const int units = a->n_kv_heads * (group_heads % 2 == 0 ? group_heads / 2 : group_heads);
    if (a->head_dim != HEAD_DIM || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads != 0 || a->hidden % 8 != 0 ||
        a->intermediate % 8 != 0 || a->n_layers <= 0 || a->vocab <= 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "cuda persistent decode: head_dim %d (needs 128), %d heads / %d kv heads, hidden %d, intermediate %d",
                         a->head_dim, a->n_heads, a->n_kv_heads, a->hidden, a->intermediate);
    int device = 0, sm_count = 0, per_sm = 0, cooperative = 0, smem_optin = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    const kernel_fn kernel = pick_kernel(*a);
    cudaFuncAttributes attributes;
    CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    /* As many weight slots per warp as shared memory holds (at most MAX_SLOTS, at least 2). */
    const long long room = (long long)smem_optin - (long long)attributes.sharedSizeBytes - (long long)input_bytes(*a);
    long long slots = room / ((long long)WARPS * SLOT_BYTES);
    if (slots > MAX_SLOTS) slots = MAX_SLOTS;
    a->n_slots = (int32_t)slots;
    if (!cooperative || slots < 2 || units > sm_count)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda persistent decode: %s",
                         !cooperative ? "the device has no cooperative launch"
                         : slots < 2  ? "too little shared memory for the weight slots"
                                      : "more attention units than SMs");
    const size_t smem = dynamic_smem(*a);
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, THREADS, smem));
    if (per_sm < 1) return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda persistent decode: one block does not fit on an SM");
    *n_blocks = sm_count;
    *workspace = carve_workspace(*a, sm_count, 0).bytes;
    return KITE_OK;
}

extern "C" kite_status cuda_decode_persistent(const cuda_decode_args *args, int n_blocks, void *stream) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(n_blocks);
    config.blockDim = dim3(THREADS);
    config.dynamicSmemBytes = dynamic_smem(*args);
    config.stream = static_cast<cudaStream_t>(stream);
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeCooperative;
    attribute[0].val.cooperative = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    CUDA_CHECK(cudaLaunchKernelEx(&config, pick_kernel(*args), *args));
    return KITE_OK;
}

/* Causal flash attention for prefill on Hopper's asynchronous tensor cores (wgmma) fed by the tensor memory
 * accelerator (TMA), for caches whose blocks hold a multiple of 128 positions: each 128-key tile is one piece of
 * one cache block, so a tile is four 2-D tensor copies (K and V, two 64-column planes each).
 *
 * A block of 384 threads owns 128 query rows of one head: two consumer warpgroups of 64 rows and a producer
 * warpgroup, one thread of which streams K and V tiles into two-stage rings (full / empty mbarriers, K and V
 * apart); its registers go to the consumers (setmaxnreg). Each consumer computes S = Q K^T with Q and K in shared
 * memory (wgmma m64n128k16, K-major), the online softmax in registers (fp32, base 2), and O += P V with P straight
 * from the S registers (the register-A form) and V transposed from shared memory. A consumer issues P V of tile
 * t - 1 together with Q K^T of tile t, and the two consumers take turns issuing (FlashAttention-3's ping-pong), so
 * one's softmax runs while the other's products do.
 * The cache positions past a sequence's context are read (whole 128-position pieces) but masked: they hold
 * finite values (the cache is zeroed when it is reserved, and later holds only finite K/V). */
#include "backend/cuda/kernels/attention_prefill_wgmma.cuh"

#include <cuda.h>

#include "backend/cuda/kernels/bulk_copy.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace {

constexpr int HEAD_DIM = 128;
constexpr int BLOCK_M = 128;         /* query rows per thread block */
constexpr int BLOCK_N = 128;         /* keys per tile */
constexpr int STAGES = 2;            /* K/V tiles in flight */
constexpr int CONSUMER_THREADS = 256; /* two warpgroups of 64 rows */
constexpr int THREADS = CONSUMER_THREADS + 128; /* + a producer warpgroup (one thread of it issues the copies) */
constexpr int PLANE_ELEMENTS = 128 * 64; /* 128 rows of 64 columns: one swizzled plane, 16 KiB */
constexpr unsigned PLANE_BYTES = PLANE_ELEMENTS * 2;

struct __align__(1024) smem_tiles {
    bf16 q[2][PLANE_ELEMENTS]; /* the block's 128 query rows, columns 0-63 and 64-127 */
    bf16 k[STAGES][2][PLANE_ELEMENTS];
    bf16 v[STAGES][2][PLANE_ELEMENTS];
    uint64_t full_k[STAGES], full_v[STAGES];   /* a stage's K (V) has landed */
    uint64_t empty_k[STAGES], empty_v[STAGES]; /* every consumer warp is done with a stage's K (V) */
};
constexpr size_t SMEM_BYTES = sizeof(smem_tiles) + 1024; /* + room to align the dynamic allocation */

__device__ __forceinline__ void warpgroup_barrier(int warpgroup) {
    asm volatile("bar.sync %0, 128;" ::"r"(warpgroup + 1) : "memory");
}

/* One 128-key tile's K or V (two 64-column planes) into stage j % STAGES, once the stage's previous tile is
 * released. */
__device__ __forceinline__ void produce_tile(bf16 (*planes)[2][PLANE_ELEMENTS], uint64_t *full, uint64_t *empty,
                                             const CUtensorMap *kv_map, const cuda_kv_layer &kv, const int32_t *table,
                                             int kv_head, int kind, int j) {
    const int s = j % STAGES;
    if (j >= STAGES) mbar_wait(&empty[s], (unsigned)((j / STAGES - 1) & 1));
    mbar_expect_tx(&full[s], 2 * PLANE_BYTES);
    const int key0 = j * BLOCK_N;
    const int block = table[key0 / kv.block_size];
    const int row = ((block * 2 + kind) * kv.n_kv_heads + kv_head) * kv.block_size + key0 % kv.block_size;
    tensor_copy_2d_to_smem(planes[s][0], kv_map, 0, row, &full[s]);
    tensor_copy_2d_to_smem(planes[s][1], kv_map, 64, row, &full[s]);
}

/* The producer, in the order the consumers use the tiles: K of tile j + 1 is asked for before V of tile j (a
 * consumer's products step t are P V of tile t - 1 then Q K^T of tile t), so each copy has a whole step to land. */
__device__ __forceinline__ void produce_tiles(smem_tiles &sm, const CUtensorMap *kv_map, const cuda_kv_layer &kv,
                                              const int32_t *table, int kv_head, int n_tiles) {
    produce_tile(sm.k, sm.full_k, sm.empty_k, kv_map, kv, table, kv_head, 0, 0);
    for (int j = 0; j < n_tiles; j++) {
        if (j + 1 < n_tiles) produce_tile(sm.k, sm.full_k, sm.empty_k, kv_map, kv, table, kv_head, 0, j + 1);
        produce_tile(sm.v, sm.full_v, sm.empty_v, kv_map, kv, table, kv_head, 1, j);
    }
}

/* A warpgroup's 64 query rows into the Q planes in the swizzled layout (zeros past the sequence's new tokens). */
__device__ __forceinline__ void load_queries(smem_tiles &sm, const bf16 *q, int n_heads, int head, int token0,
                                             int n_new, int tile_row0, int warpgroup, int t) {
    const size_t stride = (size_t)n_heads * HEAD_DIM;
#pragma unroll
    for (int i = 0; i < 8; i++) { /* 64 rows x 16 chunks of 16 bytes over 128 threads */
        const int index = t + i * 128;
        const int row = warpgroup * 64 + index / 16, chunk = index % 16;
        const int seq_row = tile_row0 + row;
        uint4 value = make_uint4(0u, 0u, 0u, 0u);
        if (seq_row < n_new)
            value = *reinterpret_cast<const uint4 *>(q + (size_t)(token0 + seq_row) * stride + (size_t)head * HEAD_DIM +
                                                     chunk * 8);
        unsigned char *plane = reinterpret_cast<unsigned char *>(sm.q[chunk / 8]);
        *reinterpret_cast<uint4 *>(plane + row * 128 + (((chunk % 8) ^ (row & 7)) * 16)) = value;
    }
    /* The products read shared memory through the async proxy: publish these generic-proxy writes to it. */
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    warpgroup_barrier(warpgroup);
}

/* The two warpgroups take turns on the tensor cores (FlashAttention-3's ping-pong): a warpgroup issues its
 * products after the other has issued its own, so one's softmax runs while the other's products do. Turn w is
 * named barrier 3 + w of both warpgroups (256 threads): the waiting warpgroup syncs, the other arrives. Both take
 * the same number of turns and arrive only as often as the other waits, so turns strictly alternate (two arrivals
 * in a row on one barrier would complete it without its waiter) and no barrier is left half-arrived. */
struct turns {
    int me, pairs, arrivals_owed;
    __device__ __forceinline__ void wait() const {
        if (pairs) asm volatile("bar.sync %0, 256;" ::"r"(3 + me) : "memory");
    }
    __device__ __forceinline__ void pass() {
        if (arrivals_owed > 0) {
            asm volatile("bar.arrive %0, 256;" ::"r"(3 + (1 - me)) : "memory");
            arrivals_owed--;
        }
    }
};

/* sc = Q K^T for this warpgroup's 64 rows and the 128 keys of K stage s (issued, not waited for). */
__device__ __forceinline__ void issue_qk(float (&sc)[64], const smem_tiles &sm, int s, int warpgroup) {
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; kk++) {
        const uint64_t desc_q = wgmma_descriptor(sm.q[kk / 4] + warpgroup * 64 * 64 + (kk % 4) * 16, 0, 1024);
        const uint64_t desc_k = wgmma_descriptor(sm.k[s][kk / 4] + (kk % 4) * 16, 0, 1024);
        wgmma_m64n128k16_ss(sc, desc_q, desc_k, kk > 0);
    }
}

/* o += P V for V stage s (issued, not waited for). */
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&p)[8][4], const smem_tiles &sm, int s) {
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; kk++) {
        const uint64_t desc_v = wgmma_descriptor(sm.v[s][0] + kk * 16 * 64, PLANE_BYTES, 1024);
        wgmma_m64n128k16_rs_tb(o, p[kk], desc_v);
    }
}

__device__ __forceinline__ void fence_fragment(uint32_t (&p)[8][4]) {
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int k = 0; k < 4; k++) asm volatile("" : "+r"(p[i][k])::"memory");
}

/* The online softmax of one tile's scores for a thread's two rows (a: row_a, b: row_a + 8): masks keys past each
 * row's position, updates the running max and sum, rescales o, and leaves exp2(s - max) in p as P V's A
 * fragment (S's fragment for keys 16 kk .. 16 kk + 15 is the A fragment of k-step kk). */
struct row_state {
    float m_a, m_b, l_a, l_b;
};
__device__ __forceinline__ void softmax_tile(float (&sc)[64], float (&o)[64], uint32_t (&p)[8][4], row_state &r,
                                             float scale_log2, bool needs_mask, int key0, int qpos_a, int qpos_b,
                                             int lane) {
    float max_a = -INFINITY, max_b = -INFINITY;
#pragma unroll
    for (int g = 0; g < 16; g++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float v = sc[4 * g + e] * scale_log2;
            if (needs_mask) {
                const int key = key0 + g * 8 + 2 * (lane % 4) + (e & 1);
                if (key > (e < 2 ? qpos_a : qpos_b)) v = -INFINITY;
            }
            sc[4 * g + e] = v;
        }
        max_a = fmaxf(max_a, fmaxf(sc[4 * g], sc[4 * g + 1]));
        max_b = fmaxf(max_b, fmaxf(sc[4 * g + 2], sc[4 * g + 3]));
    }
    max_a = fmaxf(max_a, __shfl_xor_sync(0xffffffffu, max_a, 1));
    max_a = fmaxf(max_a, __shfl_xor_sync(0xffffffffu, max_a, 2));
    max_b = fmaxf(max_b, __shfl_xor_sync(0xffffffffu, max_b, 1));
    max_b = fmaxf(max_b, __shfl_xor_sync(0xffffffffu, max_b, 2));
    float new_m_a = fmaxf(r.m_a, max_a), new_m_b = fmaxf(r.m_b, max_b);
    if (new_m_a == -INFINITY) new_m_a = 0.0f; /* a row with nothing visible yet: keep exp2 finite */
    if (new_m_b == -INFINITY) new_m_b = 0.0f;
    const float c_a = exp2f(r.m_a - new_m_a), c_b = exp2f(r.m_b - new_m_b);
    r.m_a = new_m_a;
    r.m_b = new_m_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int g = 0; g < 16; g++) {
        const float p0 = exp2f(sc[4 * g] - new_m_a), p1 = exp2f(sc[4 * g + 1] - new_m_a);
        const float p2 = exp2f(sc[4 * g + 2] - new_m_b), p3 = exp2f(sc[4 * g + 3] - new_m_b);
        sum_a += p0 + p1;
        sum_b += p2 + p3;
        p[g / 2][(g % 2) * 2] = pack_bf16x2(p0, p1);
        p[g / 2][(g % 2) * 2 + 1] = pack_bf16x2(p2, p3);
    }
    r.l_a = r.l_a * c_a + sum_a;
    r.l_b = r.l_b * c_b + sum_b;
#pragma unroll
    for (int g = 0; g < 16; g++) {
        o[4 * g] *= c_a;
        o[4 * g + 1] *= c_a;
        o[4 * g + 2] *= c_b;
        o[4 * g + 3] *= c_b;
    }
}

__global__ void __launch_bounds__(THREADS, 1)
    attention_prefill_wgmma_kernel(const bf16 *__restrict__ q, bf16 *out, const __grid_constant__ CUtensorMap kv_map,
                                   cuda_kv_layer kv, cuda_seq_meta seqs, int n_heads, float scale_log2) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    smem_tiles &sm = *reinterpret_cast<smem_tiles *>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~(uintptr_t)1023);

    const int seq = blockIdx.z, head = blockIdx.y;
    const int tile = gridDim.x - 1 - blockIdx.x; /* the longest (last) tiles start first */
    const int token0 = seqs.token_start[seq];
    const int n_new = seqs.token_start[seq + 1] - token0;
    const int tile_row0 = tile * BLOCK_M;
    if (tile_row0 >= n_new) return;
    const int ctx = seqs.context_len[seq];
    const int first_pos = ctx - n_new;
    const int rows_end = min(n_new, tile_row0 + BLOCK_M);
    const int n_tiles = (first_pos + rows_end + BLOCK_N - 1) / BLOCK_N;
    const bool two_groups = rows_end - tile_row0 > 64; /* a warpgroup with no rows sits out */

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&sm.full_k[s], 1);
            mbar_init(&sm.full_v[s], 1);
            mbar_init(&sm.empty_k[s], two_groups ? 8u : 4u);
            mbar_init(&sm.empty_v[s], two_groups ? 8u : 4u);
        }
        mbar_init_fence();
    }
    __syncthreads();

    const int32_t *table = seqs.block_tables + seqs.block_table_start[seq];
    const int kv_head = head / (n_heads / kv.n_kv_heads);
    /* Registers move from the producer warpgroup to the consumers (each SM quarter holds one producer warp and two
     * consumer warps: 24 + 2 x 240 of its 512 registers per lane). */
    if (threadIdx.x >= CONSUMER_THREADS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;" ::: "memory");
        if (threadIdx.x == CONSUMER_THREADS) produce_tiles(sm, &kv_map, kv, table, kv_head, n_tiles);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;" ::: "memory");

    const int warpgroup = threadIdx.x / 128, t = threadIdx.x % 128;
    if (warpgroup == 1 && !two_groups) return;
    const int warp = t / 32, lane = t % 32;
    const int wg_row0 = tile_row0 + warpgroup * 64; /* this warpgroup's first row in the sequence */
    /* The tiles each warpgroup needs: the block's last tile can lie wholly past warpgroup 0's rows. */
    const int tiles_0 = (first_pos + min(rows_end, tile_row0 + 64) - 1) / BLOCK_N + 1;
    const int tiles_me = warpgroup == 0 ? tiles_0 : n_tiles;
    const int row_a = wg_row0 + warp * 16 + lane / 4, row_b = row_a + 8;
    const int qpos_a = first_pos + row_a, qpos_b = first_pos + row_b;
    const int warp_first_pos = first_pos + wg_row0 + warp * 16;

    /* Each warpgroup takes n_tiles + 1 turns (Q K^T of tile 0; P V of tile t - 1 with Q K^T of tile t; P V of the
     * last), warpgroup 0 ending with an empty turn when it needs one tile fewer: each arrival is then waited for
     * before the next one on the same barrier. */
    turns turn = {warpgroup, two_groups ? 1 : 0, two_groups ? n_tiles + 1 : 0};
    load_queries(sm, q, n_heads, head, token0, n_new, tile_row0, warpgroup, t);
    if (warpgroup == 1) turn.pass(); /* warpgroup 0 goes first */

    float o[64], sc[64];
    uint32_t p[8][4];
#pragma unroll
    for (int i = 0; i < 64; i++) o[i] = sc[i] = 0.0f;
    row_state r = {-INFINITY, -INFINITY, 0.0f, 0.0f};

    /* Turn 0: Q K^T of tile 0. */
    mbar_wait(&sm.full_k[0], 0u);
    turn.wait();
    wgmma_fence_operands(sc);
    wgmma_fence();
    issue_qk(sc, sm, 0, warpgroup);
    wgmma_commit();
    turn.pass();
    wgmma_wait<0>();
    wgmma_fence_operands(sc);
    if (lane == 0) mbar_arrive(&sm.empty_k[0]);
    softmax_tile(sc, o, p, r, scale_log2, BLOCK_N - 1 > warp_first_pos, 0, qpos_a, qpos_b, lane);

    /* Turn j: P V of tile j - 1, then Q K^T of tile j. */
    for (int j = 1; j < tiles_me; j++) {
        const int sk = j % STAGES, sv = (j - 1) % STAGES;
        mbar_wait(&sm.full_k[sk], (unsigned)((j / STAGES) & 1));
        mbar_wait(&sm.full_v[sv], (unsigned)(((j - 1) / STAGES) & 1));
        turn.wait();
        wgmma_fence_operands(o);
        wgmma_fence_operands(sc);
        wgmma_fence();
        issue_pv(o, p, sm, sv);
        issue_qk(sc, sm, sk, warpgroup);
        wgmma_commit();
        turn.pass();
        wgmma_wait<0>();
        wgmma_fence_operands(o);
        wgmma_fence_operands(sc);
        fence_fragment(p);
        if (lane == 0) {
            mbar_arrive(&sm.empty_k[sk]);
            mbar_arrive(&sm.empty_v[sv]);
        }
        softmax_tile(sc, o, p, r, scale_log2, j * BLOCK_N + BLOCK_N - 1 > warp_first_pos, j * BLOCK_N, qpos_a, qpos_b,
                     lane);
    }

    /* The last turn: P V of the last tile. */
    {
        const int last = tiles_me - 1, sv = last % STAGES;
        mbar_wait(&sm.full_v[sv], (unsigned)((last / STAGES) & 1));
        turn.wait();
        wgmma_fence_operands(o);
        wgmma_fence();
        issue_pv(o, p, sm, sv);
        wgmma_commit();
        turn.pass();
        wgmma_wait<0>();
        wgmma_fence_operands(o);
        fence_fragment(p);
        if (lane == 0) mbar_arrive(&sm.empty_v[sv]);
    }
    for (int j = tiles_me; j < n_tiles; j++) { /* warpgroup 0's empty turn */
        turn.wait();
        turn.pass();
    }

    float l_a = r.l_a, l_b = r.l_b;
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
    const float inv_a = l_a > 0.0f ? 1.0f / l_a : 0.0f, inv_b = l_b > 0.0f ? 1.0f / l_b : 0.0f;
    const size_t stride = (size_t)n_heads * HEAD_DIM;
    bf16 *out_a = out + (size_t)(token0 + row_a) * stride + (size_t)head * HEAD_DIM;
    bf16 *out_b = out + (size_t)(token0 + row_b) * stride + (size_t)head * HEAD_DIM;
#pragma unroll
    for (int g = 0; g < 16; g++) {
        const int col = g * 8 + 2 * (lane % 4);
        if (row_a < n_new) *reinterpret_cast<uint32_t *>(out_a + col) = pack_bf16x2(o[4 * g] * inv_a, o[4 * g + 1] * inv_a);
        if (row_b < n_new)
            *reinterpret_cast<uint32_t *>(out_b + col) = pack_bf16x2(o[4 * g + 2] * inv_b, o[4 * g + 3] * inv_b);
    }
}

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                    const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* The driver's tensor-map encoder, looked up once (the runtime links no driver symbols). */
encode_tiled_fn tensor_map_encoder(void) {
    static encode_tiled_fn encoder = [] {
        void *fn = NULL;
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
                cudaSuccess ||
            found != cudaDriverEntryPointSuccess)
            fn = NULL;
        return reinterpret_cast<encode_tiled_fn>(fn);
    }();
    return encoder;
}

/* The layer's cache as a 2-D tensor of rows of head_dim elements (each row one position of one kind and kv head),
 * read in boxes of 128 rows x 64 columns, swizzled for the products. */
kite_status kv_tensor_map(CUtensorMap *map, const cuda_kv_layer &kv) {
    const encode_tiled_fn encode = tensor_map_encoder();
    if (!encode) return kite_fail(KITE_ERROR_BACKEND, "cuda_attention_prefill: the driver has no cuTensorMapEncodeTiled");
    const cuuint64_t dims[2] = {(cuuint64_t)HEAD_DIM,
                                (cuuint64_t)kv.n_blocks * 2 * (cuuint64_t)kv.n_kv_heads * (cuuint64_t)kv.block_size};
    const cuuint64_t strides[1] = {HEAD_DIM * sizeof(bf16)};
    const cuuint32_t box[2] = {64, BLOCK_N};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, kv.base, dims, strides, box, element_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return kite_fail(KITE_ERROR_BACKEND, "cuda_attention_prefill: cuTensorMapEncodeTiled failed (%d) for %d blocks",
                         (int)r, kv.n_blocks);
    return KITE_OK;
}

} // namespace

bool attention_prefill_wgmma_fits(const cuda_kv_layer &kv) {
    return kv.head_dim == HEAD_DIM && kv.block_size % BLOCK_N == 0 && kv.n_blocks > 0;
}

kite_status attention_prefill_wgmma(const bf16 *q, bf16 *out, const cuda_kv_layer &kv, const cuda_seq_meta &seqs,
                                    int n_heads, float scale_log2, cudaStream_t stream) {
    CUtensorMap map;
    KITE_TRY(kv_tensor_map(&map, kv));
    static const cudaError_t attribute = cudaFuncSetAttribute(
        attention_prefill_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM_BYTES);
    CUDA_CHECK(attribute);
    const dim3 grid(KITE_CEIL_DIV(seqs.max_new_tokens, BLOCK_M), n_heads, seqs.n_seqs);
    attention_prefill_wgmma_kernel<<<grid, THREADS, SMEM_BYTES, stream>>>(q, out, map, kv, seqs, n_heads, scale_log2);
    CUDA_CHECK_LAUNCH();
    return KITE_OK;
}

/* Causal flash attention for prefill (and any step batch): the new tokens of each sequence attend to
 * its whole context in the paged KV cache (earlier chunks included), GQA, fp32 online softmax.
 * Caches with blocks of a multiple of 128 positions take the wgmma + TMA kernel (attention_prefill_wgmma.cu);
 * other block sizes the kernel below, on bf16 mma.sync m16n8k16 tensor cores (fp32 accumulate).
 *
 * Grid (query tile, head, sequence); 4 warps, each owning 16 query rows of the 64-row tile. Keys and
 * values come in tiles of 64 positions, gathered from the cache blocks by cp.async into padded shared
 * memory (272-byte rows: ldmatrix is conflict-free); the next K tile loads while P.V runs and the next
 * V tile while Q.K^T runs. S = Q K^T stays in registers and is reused as the A operand of P V
 * (FlashAttention-2's layout trick), so only K and V pass through shared memory. */
#include "backend/cuda/kernels/cuda_common.cuh"
#include "backend/cuda/kernels/attention_prefill_wgmma.cuh"

namespace {

constexpr int HEAD_DIM = 128;
constexpr int BLOCK_M = 64;
constexpr int BLOCK_N = 64;
constexpr int THREADS = 128;
constexpr int ROW = HEAD_DIM + 8; /* padded shared-memory row, in elements */

__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const bf16 *p) {
    const unsigned address = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const bf16 *p) {
    const unsigned address = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}


/* Gathers keys (kind 0) or values (kind 1) [tile * 64, tile * 64 + 64) into tile_smem; positions at or
 * past ctx are zero-filled. Each thread copies one 16-byte column of 8 rows. */
__device__ __forceinline__ void load_kv_tile(bf16 (*tile_smem)[ROW], const cuda_kv_layer &kv, const int32_t *table,
                                             int kv_head, int kind, int tile, int ctx) {
    const bf16 *cache = static_cast<const bf16 *>(kv.base);
    const int chunk = threadIdx.x & 15;
#pragma unroll
    for (int i = 0; i < BLOCK_N * 16 / THREADS; i++) {
        const int row = (threadIdx.x >> 4) + i * (THREADS / 16);
        const int key = tile * BLOCK_N + row;
        const bf16 *src = cache;
        int size = 0;
        if (key < ctx) {
            src = cache + kv_offset(kv, table[key / kv.block_size], kind, kv_head, key % kv.block_size) + chunk * 8;
            size = 16;
        }
        cp_async_16(&tile_smem[row][chunk * 8], src, size);
    }
}

__global__ void __launch_bounds__(THREADS)
    attention_prefill_kernel(const bf16 *__restrict__ q, bf16 *out, cuda_kv_layer kv, cuda_seq_meta seqs, int n_heads,
                             float scale_log2) {
    __shared__ __align__(16) bf16 k_smem[BLOCK_N][ROW];
    __shared__ __align__(16) bf16 v_smem[BLOCK_N][ROW];

    const int seq = blockIdx.z, head = blockIdx.y;
    const int tile = gridDim.x - 1 - blockIdx.x; /* the longest (last) tiles start first */
    const int token0 = seqs.token_start[seq];
    const int n_new = seqs.token_start[seq + 1] - token0;
    if (tile * BLOCK_M >= n_new) return;
    const int ctx = seqs.context_len[seq];
    const int first_pos = ctx - n_new;
    const int32_t *table = seqs.block_tables + seqs.block_table_start[seq];
    const int kv_head = head / (n_heads / kv.n_kv_heads);
    const int rows_end = min(n_new, tile * BLOCK_M + BLOCK_M);
    const int kv_end = first_pos + rows_end;
    const int n_tiles = (kv_end + BLOCK_N - 1) / BLOCK_N;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int quad_row = lane >> 2, quad_col = lane & 3;
    const int warp_row0 = tile * BLOCK_M + warp * 16; /* first row of this warp, within the sequence */
    const int r0 = warp_row0 + quad_row, r1 = r0 + 8;
    const int qpos0 = first_pos + r0, qpos1 = first_pos + r1;

    load_kv_tile(k_smem, kv, table, kv_head, 0, 0, ctx);
    cp_async_commit();
    load_kv_tile(v_smem, kv, table, kv_head, 1, 0, ctx);
    cp_async_commit();

    uint32_t qf[HEAD_DIM / 16][4];
    {
        const size_t stride = (size_t)n_heads * HEAD_DIM;
        const bf16 *q0 = q + (size_t)(token0 + r0) * stride + (size_t)head * HEAD_DIM;
        const bf16 *q1 = q + (size_t)(token0 + r1) * stride + (size_t)head * HEAD_DIM;
        const bool v0 = r0 < n_new, v1 = r1 < n_new;
#pragma unroll
        for (int kk = 0; kk < HEAD_DIM / 16; kk++) {
            const int col = kk * 16 + 2 * quad_col;
            qf[kk][0] = v0 ? *reinterpret_cast<const uint32_t *>(q0 + col) : 0u;
            qf[kk][1] = v1 ? *reinterpret_cast<const uint32_t *>(q1 + col) : 0u;
            qf[kk][2] = v0 ? *reinterpret_cast<const uint32_t *>(q0 + col + 8) : 0u;
            qf[kk][3] = v1 ? *reinterpret_cast<const uint32_t *>(q1 + col + 8) : 0u;
        }
    }

    float o[HEAD_DIM / 8][4];
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

    for (int j = 0; j < n_tiles; j++) {
        cp_async_wait<1>(); /* K tile j has landed (V tile j may still be in flight) */
        __syncthreads();

        float s[BLOCK_N / 8][4];
#pragma unroll
        for (int nt = 0; nt < BLOCK_N / 8; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
            for (int kk2 = 0; kk2 < HEAD_DIM / 32; kk2++) {
                uint32_t b[4];
                ldmatrix_x4(b, &k_smem[nt * 8 + (lane & 7)][kk2 * 32 + (lane >> 3) * 8]);
                mma_bf16(s[nt], qf[2 * kk2], b[0], b[1]);
                mma_bf16(s[nt], qf[2 * kk2 + 1], b[2], b[3]);
            }
        }

        /* Scale to base 2 and apply the causal mask where this tile can reach past a row's position. */
        const bool needs_mask = j * BLOCK_N + BLOCK_N - 1 > first_pos + warp_row0;
        float max0 = -INFINITY, max1 = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < BLOCK_N / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = s[nt][e] * scale_log2;
                if (needs_mask) {
                    const int key = j * BLOCK_N + nt * 8 + 2 * quad_col + (e & 1);
                    if (key > (e < 2 ? qpos0 : qpos1)) v = -INFINITY;
                }
                s[nt][e] = v;
            }
            max0 = fmaxf(max0, fmaxf(s[nt][0], s[nt][1]));
            max1 = fmaxf(max1, fmaxf(s[nt][2], s[nt][3]));
        }
        max0 = fmaxf(max0, __shfl_xor_sync(0xffffffffu, max0, 1));
        max0 = fmaxf(max0, __shfl_xor_sync(0xffffffffu, max0, 2));
        max1 = fmaxf(max1, __shfl_xor_sync(0xffffffffu, max1, 1));
        max1 = fmaxf(max1, __shfl_xor_sync(0xffffffffu, max1, 2));
        float new_m0 = fmaxf(m0, max0), new_m1 = fmaxf(m1, max1);
        if (new_m0 == -INFINITY) new_m0 = 0.0f; /* a row with nothing visible yet: keep exp2 finite */
        if (new_m1 == -INFINITY) new_m1 = 0.0f;
        const float c0 = exp2f(m0 - new_m0), c1 = exp2f(m1 - new_m1);
        m0 = new_m0;
        m1 = new_m1;
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int nt = 0; nt < BLOCK_N / 8; nt++) {
            s[nt][0] = exp2f(s[nt][0] - m0);
            s[nt][1] = exp2f(s[nt][1] - m0);
            s[nt][2] = exp2f(s[nt][2] - m1);
            s[nt][3] = exp2f(s[nt][3] - m1);
            sum0 += s[nt][0] + s[nt][1];
            sum1 += s[nt][2] + s[nt][3];
        }
        l0 = l0 * c0 + sum0;
        l1 = l1 * c1 + sum1;
#pragma unroll
        for (int i = 0; i < HEAD_DIM / 8; i++) {
            o[i][0] *= c0;
            o[i][1] *= c0;
            o[i][2] *= c1;
            o[i][3] *= c1;
        }
        uint32_t pa[BLOCK_N / 16][4];
#pragma unroll
        for (int kk2 = 0; kk2 < BLOCK_N / 16; kk2++) {
            pa[kk2][0] = pack_bf16x2(s[2 * kk2][0], s[2 * kk2][1]);
            pa[kk2][1] = pack_bf16x2(s[2 * kk2][2], s[2 * kk2][3]);
            pa[kk2][2] = pack_bf16x2(s[2 * kk2 + 1][0], s[2 * kk2 + 1][1]);
            pa[kk2][3] = pack_bf16x2(s[2 * kk2 + 1][2], s[2 * kk2 + 1][3]);
        }

        cp_async_wait<0>(); /* V tile j has landed */
        __syncthreads();    /* and every warp is done with K tile j */
        if (j + 1 < n_tiles) load_kv_tile(k_smem, kv, table, kv_head, 0, j + 1, ctx);
        cp_async_commit();

#pragma unroll
        for (int kk2 = 0; kk2 < BLOCK_N / 16; kk2++) {
#pragma unroll
            for (int ntp = 0; ntp < HEAD_DIM / 16; ntp++) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, &v_smem[kk2 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8][ntp * 16 + (lane >> 4) * 8]);
                mma_bf16(o[2 * ntp], pa[kk2], b[0], b[1]);
                mma_bf16(o[2 * ntp + 1], pa[kk2], b[2], b[3]);
            }
        }
        __syncthreads(); /* every warp is done with V tile j */
        if (j + 1 < n_tiles) load_kv_tile(v_smem, kv, table, kv_head, 1, j + 1, ctx);
        cp_async_commit();
    }

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    const size_t stride = (size_t)n_heads * HEAD_DIM;
    bf16 *out0 = out + (size_t)(token0 + r0) * stride + (size_t)head * HEAD_DIM;
    bf16 *out1 = out + (size_t)(token0 + r1) * stride + (size_t)head * HEAD_DIM;
#pragma unroll
    for (int nt = 0; nt < HEAD_DIM / 8; nt++) {
        const int col = nt * 8 + 2 * quad_col;
        if (r0 < n_new) *reinterpret_cast<uint32_t *>(out0 + col) = pack_bf16x2(o[nt][0] * inv0, o[nt][1] * inv0);
        if (r1 < n_new) *reinterpret_cast<uint32_t *>(out1 + col) = pack_bf16x2(o[nt][2] * inv1, o[nt][3] * inv1);
    }
}

} // namespace

extern "C" kite_status cuda_attention_prefill(const void *q, void *out, cuda_kv_layer kv, cuda_seq_meta seqs,
                                              int n_heads, float scale, void *stream) {
    if (kv.head_dim != HEAD_DIM || kv.n_kv_heads <= 0 || n_heads % kv.n_kv_heads != 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda_attention_prefill: head_dim %d heads %d kv heads %d",
                         kv.head_dim, n_heads, kv.n_kv_heads);
    if (kv.dtype != KITE_KV_CACHE_BF16)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "cuda_attention_prefill: KV cache dtype %d (bf16 only: an fp8 cache is read through its bf16 "
                         "view, cuda_kv_fp8_dequantize_blocks)",
                         kv.dtype);
    if (seqs.n_seqs <= 0 || seqs.max_new_tokens <= 0) return KITE_OK;
    const float scale_log2 = scale * 1.4426950408889634f;
    if (attention_prefill_wgmma_fits(kv))
        return attention_prefill_wgmma(static_cast<const bf16 *>(q), static_cast<bf16 *>(out), kv, seqs, n_heads,
                                       scale_log2, static_cast<cudaStream_t>(stream));
    const dim3 grid(KITE_CEIL_DIV(seqs.max_new_tokens, BLOCK_M), n_heads, seqs.n_seqs);
    attention_prefill_kernel<<<grid, THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const bf16 *>(q), static_cast<bf16 *>(out), kv, seqs, n_heads, scale_log2);
    CUDA_CHECK_LAUNCH();
    return KITE_OK;
}

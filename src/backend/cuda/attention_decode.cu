/* Split-K flash-decoding attention for one new token over the paged KV cache.
 *
 * Grid (kv_head, split, head_group): a fixed grid whatever the context length, so the decode graph
 * replays it unchanged; each block takes one contiguous range of positions (context_len / n_splits
 * rounded up), for GROUP query heads that share the kv head, reading each K and V row once.
 * Inside a block 16 independent streams of 8 lanes walk the range (stream i takes positions i, i + 16,
 * ...); lane j of a stream holds dims [16 j, 16 j + 16) of K, V and the accumulator, so one position
 * costs each lane two 16-byte loads of K and two of V. Each stream keeps its own running max and sum
 * (online softmax in fp32, base 2); streams merge by shuffles, warps through shared memory, splits in
 * the last block to finish (a per-head-group counter, reset by that block). */
#include "backend/cuda/cuda_common.cuh"

namespace {

constexpr int HEAD_DIM = 128;
constexpr int THREADS = 128;
constexpr int STREAMS = THREADS / 8;
constexpr float NO_SCORE = -1.0e30f; /* finite, so exp2(NO_SCORE - NO_SCORE) stays 1, never NaN */

__device__ __forceinline__ void load_row(const bf16 *row, int sub, uint4 &a, uint4 &b) {
    const uint4 *p = reinterpret_cast<const uint4 *>(row + sub * 16);
    a = __ldcs(p); /* the cache is streamed: read once per step */
    b = __ldcs(p + 1);
}

template <int GROUP>
__global__ void __launch_bounds__(THREADS)
    attention_decode_kernel(const float *q, float *out, cuda_kv_layer kv, const int32_t *block_table,
                            const int32_t *context_len, int n_heads, float scale_log2, int n_splits, float *ws_acc,
                            float2 *ws_stats, unsigned *counters) {
    pdl_wait();
    pdl_launch_dependents();
    __shared__ float smem_acc[THREADS / 32][GROUP][HEAD_DIM];
    __shared__ float smem_m[THREADS / 32][GROUP], smem_l[THREADS / 32][GROUP];
    __shared__ bool is_last;

    const int kv_head = blockIdx.x, split = blockIdx.y;
    const int group_heads = n_heads / kv.n_kv_heads;
    const int first_head = kv_head * group_heads + blockIdx.z * GROUP;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane & 7;
    const int stream = warp * 4 + (lane >> 3);
    const int ctx = context_len[0];
    const int chunk = (ctx + n_splits - 1) / n_splits;
    const int begin = split * chunk;
    const int end = min(ctx, begin + chunk);

    float qr[GROUP][16];
#pragma unroll
    for (int g = 0; g < GROUP; g++) {
        const float4 *qp = reinterpret_cast<const float4 *>(q + (size_t)(first_head + g) * HEAD_DIM + sub * 16);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float4 v = qp[i];
            qr[g][4 * i] = v.x * scale_log2;
            qr[g][4 * i + 1] = v.y * scale_log2;
            qr[g][4 * i + 2] = v.z * scale_log2;
            qr[g][4 * i + 3] = v.w * scale_log2;
        }
    }
    float m[GROUP], l[GROUP], acc[GROUP][16];
#pragma unroll
    for (int g = 0; g < GROUP; g++) {
        m[g] = NO_SCORE;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++) acc[g][i] = 0.0f;
    }

    const bf16 *cache = static_cast<const bf16 *>(kv.base);
    const int n_rounds = end > begin ? (end - begin + STREAMS - 1) / STREAMS : 0;
    for (int round = 0; round < n_rounds; round += 2) {
        /* Two positions per stream in flight: 8 loads of 16 bytes per lane. */
        uint4 k[2][2], v[2][2];
        bool valid[2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int p = begin + (round + j) * STREAMS + stream;
            valid[j] = (round + j) < n_rounds && p < end;
            if (valid[j]) {
                const int32_t block = block_table[p / kv.block_size], slot = p % kv.block_size;
                load_row(cache + kv_offset(kv, block, 0, kv_head, slot), sub, k[j][0], k[j][1]);
                load_row(cache + kv_offset(kv, block, 1, kv_head, slot), sub, v[j][0], v[j][1]);
            } else {
                k[j][0] = k[j][1] = v[j][0] = v[j][1] = make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int j = 0; j < 2; j++) {
            float kf[16], vf[16];
            bf16x8_to_float(k[j][0], kf);
            bf16x8_to_float(k[j][1], kf + 8);
            float s[GROUP];
#pragma unroll
            for (int g = 0; g < GROUP; g++) {
                float d = 0.0f;
#pragma unroll
                for (int i = 0; i < 16; i++) d += qr[g][i] * kf[i];
                d += __shfl_xor_sync(0xffffffffu, d, 1);
                d += __shfl_xor_sync(0xffffffffu, d, 2);
                d += __shfl_xor_sync(0xffffffffu, d, 4);
                s[g] = d;
            }
            if (!valid[j]) continue;
            bf16x8_to_float(v[j][0], vf);
            bf16x8_to_float(v[j][1], vf + 8);
#pragma unroll
            for (int g = 0; g < GROUP; g++) {
                const float m_new = fmaxf(m[g], s[g]);
                const float correction = exp2f(m[g] - m_new), p = exp2f(s[g] - m_new);
                m[g] = m_new;
                l[g] = l[g] * correction + p;
#pragma unroll
                for (int i = 0; i < 16; i++) acc[g][i] = acc[g][i] * correction + p * vf[i];
            }
        }
    }

    /* Merge the 4 streams of each warp (lanes 8 and 16 apart). */
#pragma unroll
    for (int offset = 8; offset <= 16; offset <<= 1) {
#pragma unroll
        for (int g = 0; g < GROUP; g++) {
            const float m_other = __shfl_xor_sync(0xffffffffu, m[g], offset);
            const float l_other = __shfl_xor_sync(0xffffffffu, l[g], offset);
            const float m_new = fmaxf(m[g], m_other);
            const float a = exp2f(m[g] - m_new), b = exp2f(m_other - m_new);
            m[g] = m_new;
            l[g] = l[g] * a + l_other * b;
#pragma unroll
            for (int i = 0; i < 16; i++) {
                const float other = __shfl_xor_sync(0xffffffffu, acc[g][i], offset);
                acc[g][i] = acc[g][i] * a + other * b;
            }
        }
    }
    if (lane < 8) {
#pragma unroll
        for (int g = 0; g < GROUP; g++) {
#pragma unroll
            for (int i = 0; i < 16; i++) smem_acc[warp][g][sub * 16 + i] = acc[g][i];
            if (lane == 0) {
                smem_m[warp][g] = m[g];
                smem_l[warp][g] = l[g];
            }
        }
    }
    __syncthreads();

    /* This split's partial result per head: thread d owns dim d. */
    const int d = threadIdx.x;
#pragma unroll
    for (int g = 0; g < GROUP; g++) {
        float m_all = NO_SCORE;
#pragma unroll
        for (int w = 0; w < THREADS / 32; w++) m_all = fmaxf(m_all, smem_m[w][g]);
        float l_all = 0.0f, a_all = 0.0f;
#pragma unroll
        for (int w = 0; w < THREADS / 32; w++) {
            const float f = exp2f(smem_m[w][g] - m_all);
            l_all += smem_l[w][g] * f;
            a_all += smem_acc[w][g][d] * f;
        }
        const size_t index = (size_t)(first_head + g) * (size_t)n_splits + (size_t)split;
        ws_acc[index * HEAD_DIM + d] = a_all;
        if (d == 0) ws_stats[index] = make_float2(m_all, l_all);
    }

    /* The last block of this head group to finish combines all splits. */
    __threadfence();
    __syncthreads();
    const unsigned counter_index = (unsigned)(first_head / GROUP);
    if (threadIdx.x == 0) is_last = atomicAdd(&counters[counter_index], 1u) == (unsigned)(n_splits - 1);
    __syncthreads();
    if (!is_last) return;
    __threadfence();
#pragma unroll
    for (int g = 0; g < GROUP; g++) {
        const size_t base = (size_t)(first_head + g) * (size_t)n_splits;
        float m_all = NO_SCORE;
        for (int sp = 0; sp < n_splits; sp++) m_all = fmaxf(m_all, __ldcg(&ws_stats[base + sp]).x);
        float l_all = 0.0f, a_all = 0.0f;
        for (int sp = 0; sp < n_splits; sp++) {
            const float2 st = __ldcg(&ws_stats[base + sp]);
            const float f = exp2f(st.x - m_all);
            l_all += st.y * f;
            a_all += __ldcg(&ws_acc[(base + sp) * HEAD_DIM + d]) * f;
        }
        out[(size_t)(first_head + g) * HEAD_DIM + d] = a_all / l_all;
    }
    if (threadIdx.x == 0) counters[counter_index] = 0;
}

int group_size_for(int group_heads) {
    if (group_heads % 4 == 0) return 4;
    if (group_heads % 2 == 0) return 2;
    return 1;
}

} // namespace

extern "C" size_t cuda_attention_decode_workspace(int n_heads, int head_dim, int n_splits) {
    return (size_t)n_heads * (size_t)n_splits * ((size_t)head_dim * sizeof(float) + sizeof(float2));
}

extern "C" kite_status cuda_attention_decode(const float *q, float *out, cuda_kv_layer kv, const int32_t *block_table,
                                             const int32_t *context_len, int n_heads, float scale, int n_splits,
                                             void *workspace, unsigned *counters, void *stream, int use_pdl) {
    if (kv.head_dim != HEAD_DIM || kv.n_kv_heads <= 0 || n_heads % kv.n_kv_heads != 0 || n_splits <= 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda_attention_decode: head_dim %d heads %d kv heads %d splits %d",
                         kv.head_dim, n_heads, kv.n_kv_heads, n_splits);
    const int group_heads = n_heads / kv.n_kv_heads;
    const int group = group_size_for(group_heads);
    const dim3 grid(kv.n_kv_heads, n_splits, group_heads / group);
    float *ws_acc = static_cast<float *>(workspace);
    float2 *ws_stats = reinterpret_cast<float2 *>(ws_acc + (size_t)n_heads * (size_t)n_splits * HEAD_DIM);
    const float scale_log2 = scale * 1.4426950408889634f;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const bool pdl = use_pdl != 0;
    switch (group) {
    case 4:
        CUDA_CHECK(launch_kernel(attention_decode_kernel<4>, grid, dim3(THREADS), 0, s, pdl, q, out, kv, block_table,
                                 context_len, n_heads, scale_log2, n_splits, ws_acc, ws_stats, counters));
        break;
    case 2:
        CUDA_CHECK(launch_kernel(attention_decode_kernel<2>, grid, dim3(THREADS), 0, s, pdl, q, out, kv, block_table,
                                 context_len, n_heads, scale_log2, n_splits, ws_acc, ws_stats, counters));
        break;
    default:
        CUDA_CHECK(launch_kernel(attention_decode_kernel<1>, grid, dim3(THREADS), 0, s, pdl, q, out, kv, block_table,
                                 context_len, n_heads, scale_log2, n_splits, ws_acc, ws_stats, counters));
        break;
    }
    return KITE_OK;
}

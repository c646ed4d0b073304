/* Pieces shared by the decode attention kernels (attention_decode.cu, attention_decode_bulk.cu). Lane layouts: a warp normalising one 128-value head holds
 * dims 2l, 2l + 1, 64 + 2l, 65 + 2l in lane l; in the attention loop 4 streams of 8 lanes each walk their own
 * positions, lane j of a stream holding 16 dims of K, V and the accumulator (stream_dim). Scores are in
 * base 2. */
#ifndef KITE_BACKEND_CUDA_DECODE_ATTENTION_CUH
#define KITE_BACKEND_CUDA_DECODE_ATTENTION_CUH

#include "backend/cuda/kernels/cuda_common.cuh"

constexpr int DECODE_HEAD_DIM = 128; /* the only head_dim the CUDA kernels implement (every Qwen3 dense size) */

/* The dim that index i (0 .. 15) of lane j's 16 values stands for: [8 j, 8 j + 8), then [64 + 8 j, 64 + 8 j + 8).
 * A row's 16-byte pieces j and j + 8 are then lane j's, so each 16-byte load of a stream's 8 lanes reads 128
 * contiguous bytes (coalesced from global memory, free of bank conflicts in shared memory; ncu counted ~50%
 * excess sectors / wavefronts with contiguous 16-dim runs per lane). */
__host__ __device__ __forceinline__ int stream_dim(int lane_in_stream, int i) {
    return i < 8 ? 8 * lane_in_stream + i : DECODE_HEAD_DIM / 2 + 8 * lane_in_stream + (i - 8);
}

/* The fp8 cache's lane layout (attention_decode.cu): lane j of a stream holds dims 16 j .. 16 j + 15, one 16-byte
 * load of codes, so that the 8 lanes of a stream read a row's 128 contiguous bytes. */
__host__ __device__ __forceinline__ int stream_dim_fp8(int lane_in_stream, int i) { return 16 * lane_in_stream + i; }

/* Query heads per attention block: the largest of 4, 2, 1 dividing the heads that share a kv head (each K/V row
 * a block reads serves that many heads). */
static inline int decode_group_size(int group_heads) {
    if (group_heads % 4 == 0) return 4;
    if (group_heads % 2 == 0) return 2;
    return 1;
}

/* RMSNorm (* weight w) and RoPE (rotate-half, angles c / s) of one head held by a warp, from the lane's
 * loaded values lo = dims (2l, 2l + 1) and hi = dims (64 + 2l, 65 + 2l). */
__device__ __forceinline__ void norm_rope_lane(float2 lo, float2 hi, const float w[4], float2 c, float2 s, float eps,
                                               float out[4]) {
    const float sum_sq = warp_sum(lo.x * lo.x + lo.y * lo.y + hi.x * hi.x + hi.y * hi.y);
    const float scale = rsqrtf(sum_sq / (float)DECODE_HEAD_DIM + eps);
    lo.x *= scale * w[0];
    lo.y *= scale * w[1];
    hi.x *= scale * w[2];
    hi.y *= scale * w[3];
    out[0] = lo.x * c.x - hi.x * s.x;
    out[1] = lo.y * c.y - hi.y * s.y;
    out[2] = hi.x * c.x + lo.x * s.x;
    out[3] = hi.y * c.y + lo.y * s.y;
}

/* An attention output value, fp32 or bf16 (the batched path's o_proj stages bf16 input). */
__device__ __forceinline__ void store_decode_out(float *p, float v) { *p = v; }
__device__ __forceinline__ void store_decode_out(bf16 *p, float v) { *p = __float2bfloat16(v); }

/* A stream's empty state: no position seen (max NO_SCORE, sum 0, accumulator 0). */
constexpr float DECODE_NO_SCORE = -1.0e30f; /* finite, so exp2(NO_SCORE - NO_SCORE) stays 1, never NaN */
template <int GROUP>
__device__ __forceinline__ void stream_init(float m[GROUP], float l[GROUP], float acc[GROUP][16]) {
#pragma unroll
    for (int g = 0; g < GROUP; g++) {
        m[g] = DECODE_NO_SCORE;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++) acc[g][i] = 0.0f;
    }
}

/* The scores (base 2) of one position for GROUP query heads: each lane's 16-dim dot product of its query
 * values qr and key values kf, summed over the 8 lanes of its stream. Every lane of the warp calls it. */
template <int GROUP>
__device__ __forceinline__ void stream_scores(const float qr[GROUP][16], const float kf[16], float s[GROUP]) {
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
}

/* Folds one position (scores s, this lane's 16 values vf) into a stream's running max, sum and accumulator. */
template <int GROUP>
__device__ __forceinline__ void online_softmax_add(float m[GROUP], float l[GROUP], float acc[GROUP][16],
                                                   const float s[GROUP], const float vf[16]) {
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

/* online_softmax_add for a whole converged warp (every lane calls it), the values vf times v_scale (an fp8 row's
 * scale; 1 for bf16), with the rescale deferred: a stream's
 * running max m moves only when some lane's score exceeds its m by more than DECODE_RESCALE_MARGIN (base 2), a
 * warp-uniform branch, so most positions skip the accumulator's multiply by the correction. The terms
 * p = exp2(s - m) may then reach 2^DECODE_RESCALE_MARGIN, harmless in fp32; the result is the same, since the
 * merges and the final division use the same m as the terms. A score of -INFINITY adds nothing. */
constexpr float DECODE_RESCALE_MARGIN = 8.0f;
template <int GROUP>
__device__ __forceinline__ void online_softmax_add_warp(float m[GROUP], float l[GROUP], float acc[GROUP][16],
                                                        const float s[GROUP], const float vf[16],
                                                        float v_scale = 1.0f) {
#pragma unroll
    for (int g = 0; g < GROUP; g++) {
        if (__any_sync(0xffffffffu, s[g] > m[g] + DECODE_RESCALE_MARGIN)) {
            const float m_new = fmaxf(m[g], s[g]);
            const float correction = exp2f(m[g] - m_new);
            m[g] = m_new;
            l[g] *= correction;
#pragma unroll
            for (int i = 0; i < 16; i++) acc[g][i] *= correction;
        }
        const float p = exp2f(s[g] - m[g]), pv = p * v_scale;
        l[g] += p;
#pragma unroll
        for (int i = 0; i < 16; i++) acc[g][i] = fmaf(pv, vf[i], acc[g][i]);
    }
}

/* Merges the 4 streams of a warp (lanes 8 and 16 apart): afterwards lanes 0-7 hold the warp's result. */
template <int GROUP>
__device__ __forceinline__ void merge_warp_streams(float m[GROUP], float l[GROUP], float acc[GROUP][16]) {
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
}

/* The warps' results of a block in shared memory (after merge_warp_streams, lanes 0-7 of each warp hold its
 * result) and their merge for one (head g, dim d). GROUP_CAP >= the GROUP stored. */
template <int WARPS, int GROUP_CAP>
struct __align__(16) warp_partials {
    float acc[WARPS][GROUP_CAP][DECODE_HEAD_DIM];
    float m[WARPS][GROUP_CAP], l[WARPS][GROUP_CAP];

    /* FP8: the lanes hold stream_dim_fp8's dims, else stream_dim's. */
    template <int GROUP, bool FP8 = false>
    __device__ __forceinline__ void store(int warp, int lane, const float m_[GROUP], const float l_[GROUP],
                                          const float acc_[GROUP][16]) {
        if (lane >= 8) return;
#pragma unroll
        for (int g = 0; g < GROUP; g++) {
#pragma unroll
            for (int i = 0; i < 16; i++)
                acc[warp][g][FP8 ? stream_dim_fp8(lane, i) : stream_dim(lane, i)] = acc_[g][i];
            if (lane == 0) {
                m[warp][g] = m_[g];
                l[warp][g] = l_[g];
            }
        }
    }
    /* The block's max, sum and accumulator value of head g, dim d over all warps. */
    __device__ __forceinline__ void merge(int g, int d, float &m_all, float &l_all, float &a_all) const {
        m_all = DECODE_NO_SCORE;
#pragma unroll
        for (int w = 0; w < WARPS; w++) m_all = fmaxf(m_all, m[w][g]);
        l_all = 0.0f;
        a_all = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) {
            const float f = exp2f(m[w][g] - m_all);
            l_all += l[w][g] * f;
            a_all += acc[w][g][d] * f;
        }
    }
};

#endif

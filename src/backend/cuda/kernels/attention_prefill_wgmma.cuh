/* The Hopper prefill attention (attention_prefill_wgmma.cu), which cuda_attention_prefill chooses for caches
 * whose blocks hold a multiple of 128 positions. */
#ifndef KITE_BACKEND_CUDA_ATTENTION_PREFILL_WGMMA_CUH
#define KITE_BACKEND_CUDA_ATTENTION_PREFILL_WGMMA_CUH

#include "backend/cuda/kernels/cuda_common.cuh"

/* Whether the kernel takes this cache: head_dim 128, blocks of a multiple of 128 positions, the block count known. */
bool attention_prefill_wgmma_fits(const cuda_kv_layer &kv);

/* cuda_attention_prefill's contract; scale_log2 = softmax scale x log2(e). */
kite_status attention_prefill_wgmma(const bf16 *q, bf16 *out, const cuda_kv_layer &kv, const cuda_seq_meta &seqs,
                                    int n_heads, float scale_log2, cudaStream_t stream);

#endif

/* Where the CUDA backend keeps each weight in its one device allocation, computed from the config alone, and how
 * that allocation is exported to the weight cache as segments. Plain C and free of CUDA, so that the checkpoint
 * upload (cuda/cuda_weights.cu), the cache's export and import (cuda/cuda_weight_cache.cu) and a test without a
 * GPU all use the same numbers: a cache entry's sizes are checked against the layout of the config that reads it,
 * and an entry made for another shape, or for a tied model when this one is untied, never fits.
 *
 * The allocation, every piece starting at a multiple of CUDA_WEIGHT_ALIGN bytes:
 *   embed (vocab, hidden) bf16, lm_head (vocab, hidden) bf16 unless tied (then it is the embedding), final norm
 *   (hidden) fp32, then per layer: qkv (q_dim + 2 kv_dim, hidden) bf16 (q_proj, k_proj, v_proj rows), o (hidden,
 *   q_dim) bf16, gate_up (2 intermediate, hidden) bf16 (gate_proj rows, then up_proj rows), down (hidden,
 *   intermediate) bf16, input norm and post-attention norm (hidden) fp32, q norm and k norm (head_dim) fp32.
 * With --weights fp8 (KITE_WEIGHTS_FP8) each of the four linear pieces is instead its E4M3 codes (one byte per
 * weight, same rows and columns) followed by its float32 block scales, row-major [ceil(rows / 128)][ceil(cols / 128)]
 * (quant/fp8.h; w = code x scale). The fused pieces keep one scale grid per fused matrix: every source matrix's
 * rows start at a multiple of 128 (cuda_weight_layout_make refuses a shape where they would not), so a 128-row
 * block never straddles two sources and the fused grid is the sources' grids one after another. The embedding and
 * the lm_head stay bf16 and the norms fp32 in both modes. */
#ifndef KITE_BACKEND_CUDA_WEIGHT_LAYOUT_H
#define KITE_BACKEND_CUDA_WEIGHT_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "kite.h"
#include "model/qwen3.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_WEIGHT_ALIGN ((uint64_t)256)
/* The largest segment the allocation is exported as: one read of a cache entry covers at most this much, and a
 * segment's size stays far from what a 32-bit count or an mmap window would trouble. */
#define CUDA_WEIGHT_SEGMENT_MAX_BYTES ((uint64_t)1 << 30)

/* Byte offsets of one layer's pieces from the layer's start; the *_scale offsets are the fp8 block scales (0 for
 * bf16 weights). */
typedef struct cuda_layer_layout {
    uint64_t qkv, o, gate_up, down;
    uint64_t qkv_scale, o_scale, gate_up_scale, down_scale;
    uint64_t input_norm, post_norm, q_norm, k_norm;
} cuda_layer_layout;

typedef struct cuda_weight_layout {
    kite_weights weights;                /* KITE_WEIGHTS_BF16 or KITE_WEIGHTS_FP8: how the linear pieces are held */
    bool tied;                           /* the lm_head is the embedding: lm_head == embed */
    uint64_t embed, lm_head, final_norm; /* byte offsets */
    uint64_t first_layer;                /* layer l starts at first_layer + l * layer_bytes */
    uint64_t layer_bytes;
    cuda_layer_layout layer;
    uint64_t total; /* bytes of the allocation */
} cuda_weight_layout;

/* The layout of config's weights, the lm_head shared with the embedding when `tied`, the linear layers in the
 * `weights` mode. Fails with KITE_ERROR_INVALID_ARGUMENT naming the field when a dimension is not positive, the mode
 * is neither bf16 nor fp8, or the sizes overflow, and with KITE_ERROR_UNSUPPORTED when fp8 is asked for a shape
 * whose fused source matrices do not start at multiples of 128 rows (q_dim, kv_dim, intermediate_size). */
kite_status cuda_weight_layout_make(const qwen3_config *config, bool tied, kite_weights weights,
                                    cuda_weight_layout *out);

/* The number of fp8 scale columns of a matrix of `cols` columns: the row stride of its scale grid. */
static inline int32_t cuda_weight_layout_scale_cols(int64_t cols) { return (int32_t)((cols + 127) / 128); }

/* Where one source matrix of a layer (q_proj, ..., down_proj) lands in the fp8 layout: its codes, and its scale grid
 * as a band of whole block rows of its fused piece's grid (the same columns, so the same row stride). */
typedef struct cuda_fp8_source_place {
    const char *name;    /* "q_proj", ... */
    int64_t rows, cols;  /* the source's shape */
    uint64_t codes;      /* byte offset of its first code from the layer's start */
    uint64_t scales;     /* byte offset of its first float32 scale from the layer's start */
    int32_t scale_ld;    /* scales per block row: cuda_weight_layout_scale_cols(cols) */
} cuda_fp8_source_place;

#define CUDA_FP8_SOURCES 7

/* The seven linear sources of a layer of config in the fp8 layout `layout` (made for config), in the order q_proj,
 * k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj. Fails with KITE_ERROR_INVALID_ARGUMENT when the layout is
 * not an fp8 one. */
kite_status cuda_weight_layout_fp8_sources(const cuda_weight_layout *layout, const qwen3_config *config,
                                           cuda_fp8_source_place out[CUDA_FP8_SOURCES]);

/* The allocation as segments "weights.0", "weights.1", ...: CUDA_WEIGHT_SEGMENT_MAX_BYTES each, the last one
 * shorter. Segment i starts at byte i * CUDA_WEIGHT_SEGMENT_MAX_BYTES of the allocation. */
int32_t cuda_weight_layout_segment_count(const cuda_weight_layout *layout);
/* Segment `index` (0 <= index < the count): its name and size, and where it starts in the allocation. */
void cuda_weight_layout_segment(const cuda_weight_layout *layout, int32_t index, backend_segment *out,
                                uint64_t *offset);

/* Whether source holds exactly this layout's segments (the count, every name and size) and reads them in chunks
 * of 1 byte to CUDA_WEIGHT_SEGMENT_MAX_BYTES (what the import stages, twice, in pinned memory); fails with
 * KITE_ERROR_INVALID_CHECKPOINT naming what differs, before anything is allocated from the entry. */
kite_status cuda_weight_layout_check_source(const cuda_weight_layout *layout, const backend_segment_source *source);

#ifdef __cplusplus
}
#endif

#endif

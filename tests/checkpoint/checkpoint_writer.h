/* Writes Qwen3 checkpoints in the Hugging Face hub layout from C, for tests.
 *
 * checkpoint_writer_write() makes DIR/config.json (hub format) and either DIR/model.safetensors or N shards
 * model-0000K-of-0000N.safetensors plus model.safetensors.index.json, with deterministic pseudo-random
 * weights (norm weights near 1, others small). Lower-level pieces let tests build damaged checkpoints:
 * list the tensors of a shape, edit the list (drop, add, reshape, retype), then write it.
 * Helpers return false (after printing why to stderr) on any failure.
 */
#ifndef KITE_TESTS_CHECKPOINT_WRITER_H
#define KITE_TESTS_CHECKPOINT_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/qwen3.h"

typedef struct checkpoint_writer_shape {
    int32_t vocab_size;
    int32_t hidden_size;
    int32_t intermediate_size;
    int32_t n_layers;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;
    bool tie_word_embeddings;
    bool write_lm_head_when_tied; /* store lm_head.weight even when tied (transformers ignores it) */
    tensor_dtype dtype;           /* of every tensor, and config.json's torch_dtype */
    int n_shards;                 /* 0: one model.safetensors; N >= 1: N shards + index */
    uint64_t seed;                /* weight contents */
    /* Qwen's FP8 layout: each linear layer's weight (q, k, v, o, gate, up, down) stored as F8_E4M3 with
     * <name>_scale_inv (F32, one per 128 x 128 block), quantized by quant/fp8.h from the BF16 values the plain
     * checkpoint of this seed holds, and config.json with that quantization_config. */
    bool fp8_linear;
} checkpoint_writer_shape;

#define CHECKPOINT_WRITER_MAX_DIMS 4

typedef struct checkpoint_writer_tensor {
    char name[96];
    char dtype[16]; /* safetensors spelling ("BF16"); any string, for damage tests */
    int32_t n_dims;
    int64_t shape[CHECKPOINT_WRITER_MAX_DIMS];
    int shard; /* 0-based shard index when sharded */
} checkpoint_writer_tensor;

/* The tiny shape of /work/shared/device/make_checkpoint.py with a 256-token vocabulary: hidden 32,
 * intermediate 96, 2 layers, 2 heads, 1 kv head, head_dim 32, tied, BF16, one file. */
void checkpoint_writer_shape_tiny(checkpoint_writer_shape *shape);

/* Every tensor of the shape in hub order, shards assigned round-robin by position. Returns the count
 * (which may exceed capacity: then only `capacity` were written). */
size_t checkpoint_writer_list_tensors(const checkpoint_writer_shape *shape, checkpoint_writer_tensor *out,
                                      size_t capacity);

/* Bytes per element for a safetensors dtype string (unknown strings count 2, so damage tests still write). */
size_t checkpoint_writer_dtype_size(const char *dtype);

/* The deterministic contents of a tensor: n_elements of dtype (BF16, F16, F32; others get zero bytes; the F8_E4M3
 * matrices and their scales of an fp8_linear shape are written from these BF16 values by
 * checkpoint_writer_write_safetensors). */
void checkpoint_writer_fill(const char *name, const char *dtype, size_t n_elements, uint64_t seed, void *dst);

/* config.json in the hub format for the shape. */
bool checkpoint_writer_write_config(const char *dir, const checkpoint_writer_shape *shape);

/* One safetensors file holding `tensors` (all of them, shard field ignored), contiguous, header padded to 8. */
bool checkpoint_writer_write_safetensors(const char *path, const checkpoint_writer_tensor *tensors, size_t n,
                                         uint64_t seed);

/* Shard files for n_shards >= 1 (tensors grouped by their shard field) and the index naming them. */
bool checkpoint_writer_write_sharded(const char *dir, const checkpoint_writer_tensor *tensors, size_t n, int n_shards,
                                     uint64_t seed);

/* A safetensors file from a literal header (padded as given) and data_size bytes of 0x5a. */
bool checkpoint_writer_write_raw(const char *path, const char *header, size_t data_size);

/* config.json + weights for the shape. */
bool checkpoint_writer_write(const char *dir, const checkpoint_writer_shape *shape);

/* Name of shard k (0-based) of n: "model-0000{k+1}-of-0000{n}.safetensors". */
void checkpoint_writer_shard_name(int k, int n, char *buffer, size_t capacity);

/* Filesystem helpers. make_temp_dir returns a malloc'd fresh directory under $TMPDIR (or /tmp);
 * remove_dir deletes the files in it and the directory; path joins (malloc'd). */
char *checkpoint_writer_make_temp_dir(void);
bool checkpoint_writer_remove_dir(const char *dir);
char *checkpoint_writer_path(const char *dir, const char *name);
bool checkpoint_writer_write_file(const char *path, const void *data, size_t size);

#endif

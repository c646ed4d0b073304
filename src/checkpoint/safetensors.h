/* One .safetensors file: mapped read-only, validated completely before anything uses it.
 *
 * Layout: u64 little-endian header length N, N bytes of UTF-8 JSON, then the data area. The JSON maps
 * tensor names to {dtype, shape, data_offsets: [begin, end]} (offsets relative to the data area) and may
 * hold "__metadata__" (an object of strings). Rules checked, each failure naming file, tensor and field:
 * - file >= 8 bytes; 2 <= N <= SAFETENSORS_MAX_HEADER_BYTES; 8 + N <= file size;
 * - the header is valid UTF-8 and a JSON object; names are unique and free of control characters;
 * - dtype is a known safetensors dtype; BF16, F16, F32 and F8_E4M3 are supported (checkpoint.c decides
 *   where F8_E4M3 may appear), the other known ones give
 *   KITE_ERROR_UNSUPPORTED (after the whole file has been checked), unknown strings are damage;
 * - before parsing: nesting at most 3 deep, no array of more than 64 items, at most
 *   SAFETENSORS_MAX_TENSORS entries and SAFETENSORS_MAX_HEADER_SEPARATORS commas and brackets;
 * - shape is an array (at most SAFETENSORS_MAX_DIMS) of non-negative integers;
 * - begin <= end and product(shape) x dtype size == end - begin, with overflow checks;
 * - sorted by begin, the spans tile the data area exactly from 0: no overlap, no hole, no trailing bytes.
 * Damage is KITE_ERROR_INVALID_CHECKPOINT; open/stat/mmap failures KITE_ERROR_IO.
 */
#ifndef KITE_CHECKPOINT_SAFETENSORS_H
#define KITE_CHECKPOINT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "kite.h"
#include "model/qwen3.h"

#define SAFETENSORS_MAX_HEADER_BYTES ((uint64_t)100 * 1000 * 1000) /* the reference implementation's limit */
#define SAFETENSORS_MAX_DIMS 8
/* Qwen3-32B has 707 tensors; a file of more is not a checkpoint kite reads, and the bound keeps the cost
 * of parsing a hostile header in proportion to the real ones (see scan_header). */
#define SAFETENSORS_MAX_TENSORS 65536
#define SAFETENSORS_MAX_HEADER_SEPARATORS (16 * SAFETENSORS_MAX_TENSORS)

typedef struct safetensors_tensor {
    const char *name; /* NUL-terminated, owned by the file */
    tensor_dtype dtype;
    int32_t n_dims; /* 0 (a scalar) .. SAFETENSORS_MAX_DIMS */
    int64_t shape[SAFETENSORS_MAX_DIMS];
    uint64_t data_begin; /* byte offsets relative to the data area */
    uint64_t data_end;
    const void *data; /* start of the tensor's bytes; aligned only as the file happens to be */
} safetensors_tensor;

typedef struct safetensors_file safetensors_file;

/* Opens, maps and validates `path`. On failure *out is NULL and nothing is left open. */
kite_status safetensors_open(const char *path, safetensors_file **out);

/* Validates size bytes at data (a whole file image) without copying them: the tensors' data pointers point
 * into `data`, which must outlive the result. `name` labels messages. Used by the fuzzer and tests. */
kite_status safetensors_parse_memory(const void *data, size_t size, const char *name, safetensors_file **out);

/* Unmaps (when opened from a path) and frees. NULL is allowed. */
void safetensors_close(safetensors_file *file);

/* The file's first 8 + N bytes (the length and the JSON header) as mapped; empty for a file parsed from
 * memory. */
void safetensors_header_bytes(const safetensors_file *file, const void **data, size_t *size);

/* The path or name given at open. */
const char *safetensors_name(const safetensors_file *file);

/* Tensors in name order (strcmp), for iteration. */
size_t safetensors_count(const safetensors_file *file);
const safetensors_tensor *safetensors_tensor_at(const safetensors_file *file, size_t index);

/* Lookup by exact name (binary search); NULL when absent. */
const safetensors_tensor *safetensors_find(const safetensors_file *file, const char *name);

/* The value of a "__metadata__" key, or NULL. */
const char *safetensors_metadata_get(const safetensors_file *file, const char *key);

/* "BF16", "F16", "F32", "F8_E4M3". */
const char *safetensors_dtype_name(tensor_dtype dtype);

#endif

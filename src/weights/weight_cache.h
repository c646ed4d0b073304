/* One weight cache entry: the bytes a backend holds after conversion, as its named segments, in one file.
 *
 * Layout (integers little-endian):
 *   prologue, 32 bytes: magic "KITEWCE\0", u32 format version, u32 0, u64 header size H, u64 hash64 of the header
 *   header, H bytes:    u64 created (Unix time), u64 file size, u64 chunk bytes C, u32 key size, the key text
 *                       (weight_cache_key.h), u32 segment count, then per segment: u32 name size, the name,
 *                       u64 file offset, u64 size, and one u64 hash64 per C-byte chunk (the last may be short)
 *   data:               each segment at a multiple of WEIGHT_CACHE_ALIGN, in header order, without overlap.
 * Every chunk carries its own checksum, so a reader checks what it staged before it uses it and a GPU backend
 * never needs a whole segment in host memory (backend_segment_source).
 *
 * A fill writes a temporary file in the same folder (its name unique to the process), fsyncs it, renames it
 * over the entry and fsyncs the folder: a reader sees the old entry or the new one, never a mix, and two
 * processes filling the same entry each rename a whole one. Opening validates the prologue, the header's hash,
 * every size and offset against the file's real size (a truncated entry fails here), and the key, before any
 * size read from the file is used to allocate; each read then checks its chunks' hashes.
 */
#ifndef KITE_WEIGHTS_WEIGHT_CACHE_H
#define KITE_WEIGHTS_WEIGHT_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "kite.h"
#include "weights/load_progress.h"

/* 2: the CPU backend holds its linear layers packed (cpu_pack_rows). */
#define WEIGHT_CACHE_FORMAT_VERSION 2
#define WEIGHT_CACHE_SUFFIX ".kwc"
#define WEIGHT_CACHE_ALIGN ((uint64_t)4096)
#define WEIGHT_CACHE_CHUNK_BYTES ((uint64_t)16 << 20)
/* A header this large would describe millions of segments; no backend holds that many. */
#define WEIGHT_CACHE_MAX_HEADER_BYTES ((uint64_t)64 << 20)
#define WEIGHT_CACHE_MAX_SEGMENTS 1000000

/* Writes backend b's segments (list_segments / read_segment) as the entry at `path` under `key`, atomically
 * as above; progress counts the bytes written. On failure the temporary file is removed and nothing replaces
 * the entry. */
kite_status weight_cache_write(const char *path, const char *key, backend *b, load_progress *progress);

typedef struct weight_cache_entry weight_cache_entry;

/* Opens and validates the entry at `path` against `key` (NULL: any key, for listing). *absent is true when
 * there is no such file (a miss, KITE_ERROR_IO without a message worth showing); every other failure says what
 * is wrong in one line: damaged (bad magic, header hash, sizes), truncated, another format version, stale or
 * foreign (weight_cache_key_explain). */
kite_status weight_cache_open(const char *path, const char *key, bool *absent, weight_cache_entry **out);
void weight_cache_close(weight_cache_entry *e);

const char *weight_cache_entry_key(const weight_cache_entry *e);
int64_t weight_cache_entry_created(const weight_cache_entry *e);
uint64_t weight_cache_entry_file_size(const weight_cache_entry *e);
/* The bytes of all segments together. */
uint64_t weight_cache_entry_data_bytes(const weight_cache_entry *e);

/* The entry as a backend_segment_source: each read checks its chunks' hashes and counts its bytes in
 * progress (may be NULL). Valid while e is open. */
backend_segment_source weight_cache_entry_source(weight_cache_entry *e, load_progress *progress);

#endif

/* The key of a weight cache entry: what the bytes a backend holds after conversion depend on.
 *
 * The key is text, one "field=value" line each, stored whole in the entry and compared whole on a read:
 *   format   the cache format version (WEIGHT_CACHE_FORMAT_VERSION)
 *   model    the checkpoint folder (its real path)
 *   weights  the mode (bf16, fp8)
 *   backend  the backend (cpu, cuda) and arch, the string backend_cache_arch gives
 *   file     one line per file: config.json and model.safetensors.index.json (when present) with their size,
 *            mtime and a hash of their whole text; each safetensors file with its size, mtime and a hash of
 *            its header (8-byte length and JSON: the names, dtypes, shapes and offsets of every tensor).
 * The entry's file name is a hash of the first five lines (the slot), so a changed checkpoint finds its old
 * entry and replaces it (stale), and an entry that is in a slot not its own is told apart (foreign).
 * A checkpoint rewritten in place with the same header, size and mtime is not noticed: the mtime is the
 * cheap witness of the data, as for make; touching the file or clearing the cache rebuilds. */
#ifndef KITE_WEIGHTS_WEIGHT_CACHE_KEY_H
#define KITE_WEIGHTS_WEIGHT_CACHE_KEY_H

#include <stddef.h>

#include "checkpoint/checkpoint.h"
#include "kite.h"

typedef struct weight_cache_key {
    char *text;     /* malloc'd, NUL-terminated */
    char slot[17];  /* 16 hex digits */
} weight_cache_key;

/* The key of loading checkpoint c (opened from dir) in `weights` mode onto backend `backend_name` of `arch`.
 * Fails (KITE_ERROR_IO, KITE_ERROR_UNSUPPORTED for a path holding a line break) naming the file. */
kite_status weight_cache_key_make(const char *dir, const checkpoint *c, kite_weights weights,
                                  const char *backend_name, const char *arch, weight_cache_key *out);
void weight_cache_key_free(weight_cache_key *key);

/* Why an entry's key `found` is not `wanted`, into out: "stale: FILE changed (WHAT)" when only the checkpoint's
 * files differ, else "foreign: its FIELD is VALUE, this load's is VALUE". */
void weight_cache_key_explain(const char *found, const char *wanted, char *out, size_t capacity);

/* The value of `field` in key text (the first line "field=..."), copied into out; false when absent. */
bool weight_cache_key_field(const char *text, const char *field, char *out, size_t capacity);

#endif

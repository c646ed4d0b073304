/* Creating a checkpoint's backend through the weight cache: from a valid entry when there is one, else from
 * the checkpoint, then filling the entry. Every way the cache can fail (no folder, a damaged, truncated, stale
 * or foreign entry, a fill that cannot be written) is one NOTICE line and the load goes on from the
 * checkpoint: the cache changes how fast a load is, never what it loads. */
#ifndef KITE_WEIGHTS_CACHED_LOAD_H
#define KITE_WEIGHTS_CACHED_LOAD_H

#include "backend/backend.h"
#include "checkpoint/checkpoint.h"
#include "kite.h"
#include "weights/load_progress.h"

/* Creates the backend of `kind` (CPU or CUDA, resolved) for checkpoint c opened from dir, with config (the
 * checkpoint's, context limit applied) and bp; p gives weight_cache and the event callback. */
kite_status cached_load_create(const char *dir, const checkpoint *c, const qwen3_config *config,
                               kite_backend_kind kind, const backend_params *bp, const kite_load_params *p,
                               backend **out);

/* Creates the backend of `kind` from the checkpoint's weights, reporting the conversion's progress. */
kite_status cached_load_convert(const qwen3_config *config, const qwen3_weights *weights, uint64_t stored_bytes,
                                kite_backend_kind kind, const backend_params *bp, load_progress *progress,
                                backend **out);

#endif

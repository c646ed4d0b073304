#include "weights/cached_load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/file.h"
#include "weights/load_progress.h"
#include "weights/weight_cache.h"
#include "weights/weight_cache_folder.h"
#include "weights/weight_cache_key.h"

typedef kite_status (*create_from_segments_fn)(const qwen3_config *config, const backend_segment_source *source,
                                                const backend_params *params, backend **out);

/* The backends that can be created from a cache entry (each sets backend.segments for the fill). */
static create_from_segments_fn from_segments_for(kite_backend_kind kind) {
    switch (kind) {
    case KITE_BACKEND_CPU: return cpu_backend_create_from_segments;
    case KITE_BACKEND_CUDA: return cuda_backend_create_from_segments;
    default: return NULL;
    }
}

static const char *kind_name(kite_backend_kind kind) { return kind == KITE_BACKEND_CUDA ? "cuda" : "cpu"; }

kite_status cached_load_convert(const qwen3_config *config, const qwen3_weights *weights, uint64_t stored_bytes,
                                kite_backend_kind kind, const backend_params *bp, load_progress *progress,
                                backend **out) {
    backend_params with_progress = *bp;
    with_progress.progress = progress;
    load_progress_begin(progress, KITE_LOAD_STAGE_CHECKPOINT, stored_bytes);
    kite_status status = kind == KITE_BACKEND_CUDA ? cuda_backend_create(config, weights, &with_progress, out)
                                                   : cpu_backend_create(config, weights, &with_progress, out);
    if (status == KITE_OK) {
        /* A backend that does not count its conversion still ends with everything read. */
        if (progress->bytes_done < stored_bytes) progress->bytes_done = stored_bytes;
        load_progress_end(progress);
    }
    return status;
}

/* The entry's folder: weight_cache, or the default. Empty out: no cache for this load (after a notice when
 * the folder cannot be used). */
static void cache_folder(const kite_load_params *p, const load_progress *progress, char *out, size_t capacity) {
    out[0] = '\0';
    if (p->weight_cache && strcmp(p->weight_cache, "off") == 0) return;
    kite_status status = KITE_OK;
    if (p->weight_cache) {
        if (!p->weight_cache[0]) status = kite_fail(KITE_ERROR_INVALID_ARGUMENT, "weight cache: the folder is empty");
        else if ((size_t)snprintf(out, capacity, "%s", p->weight_cache) >= capacity)
            status = kite_fail(KITE_ERROR_IO, "weight cache: the folder's path is too long");
    } else {
        status = kite_weight_cache_default_dir(out, capacity);
    }
    if (status == KITE_OK) status = weight_cache_folder_make(out);
    if (status != KITE_OK) {
        load_progress_notice(progress, "%s; loading without the weight cache", kite_last_error());
        out[0] = '\0';
    }
}

kite_status cached_load_create(const char *dir, const checkpoint *c, const qwen3_config *config,
                               kite_backend_kind kind, const backend_params *bp, const kite_load_params *p,
                               backend **out) {
    *out = NULL;
    load_progress progress = load_progress_make(p->on_load_event, p->load_event_user_data);
    const qwen3_weights *weights = checkpoint_weights(c);
    const uint64_t stored_bytes = checkpoint_weight_bytes(c);
    /* A CUDA backend that cannot run here (no usable GPU, a build without nvcc) goes straight to its creation,
     * which says why, rather than after a notice that the cache has no architecture to key on. */
    if (kind == KITE_BACKEND_CUDA && !cuda_backend_available(NULL, 0))
        return cached_load_convert(config, weights, stored_bytes, kind, bp, &progress, out);
    create_from_segments_fn from_segments = from_segments_for(kind);
    if (!from_segments) {
        /* Said only when asked for: the default cache applies wherever a backend supports it. */
        if (p->weight_cache && strcmp(p->weight_cache, "off") != 0)
            load_progress_notice(&progress, "weight cache: the %s backend does not cache its weights; loading "
                                            "from the checkpoint", kind_name(kind));
        return cached_load_convert(config, weights, stored_bytes, kind, bp, &progress, out);
    }
    char folder[4096];
    cache_folder(p, &progress, folder, sizeof folder);
    if (!folder[0]) return cached_load_convert(config, weights, stored_bytes, kind, bp, &progress, out);

    char arch[128];
    weight_cache_key key = {0};
    kite_status status = backend_cache_arch(kind, bp->device, arch, sizeof arch);
    if (status == KITE_OK) status = weight_cache_key_make(dir, c, bp->weights, kind_name(kind), arch, &key);
    char *path = NULL;
    if (status == KITE_OK) {
        char name[64];
        snprintf(name, sizeof name, "%s%s", key.slot, WEIGHT_CACHE_SUFFIX);
        path = path_join(folder, name);
        if (!path) status = KITE_ERROR_OUT_OF_MEMORY;
    }
    if (status != KITE_OK) {
        load_progress_notice(&progress, "%s; loading without the weight cache", kite_last_error());
        weight_cache_key_free(&key);
        return cached_load_convert(config, weights, stored_bytes, kind, bp, &progress, out);
    }

    bool absent = false;
    weight_cache_entry *entry = NULL;
    status = weight_cache_open(path, key.text, &absent, &entry);
    if (status == KITE_OK) {
        backend_segment_source source = weight_cache_entry_source(entry, &progress);
        backend_params with_progress = *bp;
        with_progress.progress = &progress;
        load_progress_begin(&progress, KITE_LOAD_STAGE_CACHE_READ, weight_cache_entry_data_bytes(entry));
        status = from_segments(config, &source, &with_progress, out);
        weight_cache_close(entry);
        if (status == KITE_OK) {
            load_progress_end(&progress);
            weight_cache_key_free(&key);
            free(path);
            return KITE_OK;
        }
        /* Out of memory is not the entry's fault: the checkpoint's load would need as much. */
        if (status == KITE_ERROR_OUT_OF_MEMORY) {
            weight_cache_key_free(&key);
            free(path);
            return status;
        }
    }
    if (status != KITE_OK && !absent)
        load_progress_notice(&progress, "weight cache entry %s: %s; rebuilding it from the checkpoint", path,
                             kite_last_error());

    status = cached_load_convert(config, weights, stored_bytes, kind, bp, &progress, out);
    if (status == KITE_OK) {
        kite_status filled = weight_cache_write(path, key.text, *out, &progress);
        if (filled != KITE_OK)
            load_progress_notice(&progress, "%s; the weight cache is not filled (the run goes on)", kite_last_error());
    }
    weight_cache_key_free(&key);
    free(path);
    return status;
}

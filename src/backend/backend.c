/* Backend helpers shared by every implementation. */
#include "backend/backend.h"

#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>

#include "util/error.h"

size_t kv_bytes_per_position(const qwen3_config *config, size_t element_size) {
    /* A config that cannot describe a model has no KV footprint (0 tells the caller nothing fits). */
    if (!config || config->n_layers <= 0 || config->n_kv_heads <= 0 || config->head_dim <= 0) return 0;
    return 2 * (size_t)config->n_layers * (size_t)config->n_kv_heads * (size_t)config->head_dim * element_size;
}

size_t kv_fp8_bytes_per_position(const qwen3_config *config) {
    if (!config || config->n_layers <= 0 || config->n_kv_heads <= 0 || config->head_dim <= 0) return 0;
    return 2 * (size_t)config->n_layers * (size_t)config->n_kv_heads * ((size_t)config->head_dim + sizeof(float));
}

size_t backend_kv_bytes_per_position(const backend *b) {
    if (strcmp(b->ops->name, "cpu") == 0) return kv_bytes_per_position(b->config, sizeof(float));
    if (b->kv_cache_dtype == KITE_KV_CACHE_FP8) return kv_fp8_bytes_per_position(b->config);
    return kv_bytes_per_position(b->config, 2);
}

bool backend_offers_overlap(const backend *b) { return b->ops->argmax_begin && b->ops->argmax_end; }

kite_status backend_segment_find(const backend_segment_source *source, const char *name, uint64_t size,
                                 int32_t *index) {
    for (int32_t i = 0; i < source->n_segments; i++) {
        if (strcmp(source->segments[i].name, name) != 0) continue;
        if (source->segments[i].size != size)
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "segment %s holds %llu bytes, this model needs %llu", name,
                             (unsigned long long)source->segments[i].size, (unsigned long long)size);
        *index = i;
        return KITE_OK;
    }
    return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "segment %s is missing", name);
}

kite_status backend_cache_arch(kite_backend_kind kind, int32_t device, char *out, size_t capacity) {
    if (kind == KITE_BACKEND_CPU) {
        struct utsname name;
        if (uname(&name) != 0)
            return kite_fail(KITE_ERROR_UNSUPPORTED, "cpu backend: uname() failed, so the machine is unknown");
        snprintf(out, capacity, "%s", name.machine);
        return KITE_OK;
    }
    if (kind == KITE_BACKEND_CUDA) {
        kite_backend_probe_result probe;
        cuda_backend_probe(device, &probe);
        if (probe.compute_major <= 0)
            return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda backend: device %d has no compute capability to key on (%s)",
                             (int)device, probe.reason);
        snprintf(out, capacity, "sm_%d%d", (int)probe.compute_major, (int)probe.compute_minor);
        return KITE_OK;
    }
    return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "backend kind %d has no cache architecture", (int)kind);
}

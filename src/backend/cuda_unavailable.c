/* The CUDA backend's entry points in a build without nvcc: they say so instead of failing obscurely.
 * CMakeLists.txt compiles this file only when the CUDA backend is not built. */
#include <stdio.h>

#include "backend/backend.h"
#include "util/error.h"

int cuda_backend_available(char *reason, size_t reason_capacity) {
    if (reason && reason_capacity) snprintf(reason, reason_capacity, "this build of kite has no CUDA backend");
    return 0;
}

void cuda_backend_probe(int32_t device, kite_backend_probe_result *out) {
    *out = (kite_backend_probe_result){.available = false};
    snprintf(out->reason, sizeof out->reason, "this build of kite has no CUDA backend");
}

kite_status cuda_backend_create(const qwen3_config *config, const qwen3_weights *weights,
                                const backend_params *params, backend **out) {
    *out = NULL;
    return kite_fail(KITE_ERROR_UNSUPPORTED, "this build of kite has no CUDA backend (nvcc was not found at build time)");
}

kite_status cuda_backend_create_from_segments(const qwen3_config *config, const backend_segment_source *source,
                                              const backend_params *params, backend **out) {
    *out = NULL;
    return kite_fail(KITE_ERROR_UNSUPPORTED, "this build of kite has no CUDA backend (nvcc was not found at build time)");
}

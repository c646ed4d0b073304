/* kite.h's facts about this build and this machine: the version strings and the backend probe. */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "kite.h"
#include "kite_git_commit.h" /* generated at build time: cmake/write_git_commit.cmake */
#include "util/error.h"

#include <omp.h>

const char *kite_version(void) { return KITE_VERSION_STRING; }
const char *kite_build_commit(void) { return KITE_GIT_COMMIT; }
const char *kite_build_type(void) { return KITE_BUILD_TYPE; }

kite_status kite_backend_probe(kite_backend_kind kind, int32_t device, kite_backend_probe_result *out) {
    if (!out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_backend_probe: no output given");
    switch (kind) {
    case KITE_BACKEND_CPU:
        *out = (kite_backend_probe_result){.available = true, .n_threads = omp_get_max_threads()};
        snprintf(out->device_name, sizeof out->device_name, "cpu");
        return KITE_OK;
    case KITE_BACKEND_CUDA:
        cuda_backend_probe(device, out);
        return KITE_OK;
    case KITE_BACKEND_AUTO:
        break;
    }
    return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_backend_probe: kind %d is not cpu or cuda", (int)kind);
}

/* The timeline diagnostic's host side (cuda_common.cuh, "Timeline"): a device buffer of records that the
 * instrumented kernels of every .cu file append to, written out as raw records for bench/timeline_summary.py.
 * Only a build with KITE_TIMELINE has it; elsewhere both functions say so. */
#include "backend/cuda/cuda_backend_internal.h"
#include "backend/cuda/cuda_common.cuh"

#include <stdio.h>

#ifdef KITE_TIMELINE
extern "C" cudaError_t kite_timeline_attach_gemv(timeline_record *records, unsigned *count, unsigned capacity);
extern "C" cudaError_t kite_timeline_attach_attention_decode(timeline_record *records, unsigned *count,
                                                             unsigned capacity);

namespace {
timeline_record *timeline_device_records = nullptr;
unsigned *timeline_device_count = nullptr;
unsigned timeline_device_capacity = 0;

kite_status attach_all(timeline_record *records, unsigned *count, unsigned capacity) {
    CUDA_CHECK(kite_timeline_attach_gemv(records, count, capacity));
    CUDA_CHECK(kite_timeline_attach_attention_decode(records, count, capacity));
    return KITE_OK;
}

/* Frees the device buffers (whichever exist) and forgets them, so that a later start begins afresh; the first
 * cudaFree error, if any. */
cudaError_t release_buffers() {
    const cudaError_t records = timeline_device_records ? cudaFree(timeline_device_records) : cudaSuccess;
    const cudaError_t count = timeline_device_count ? cudaFree(timeline_device_count) : cudaSuccess;
    timeline_device_records = nullptr;
    timeline_device_count = nullptr;
    timeline_device_capacity = 0;
    return records != cudaSuccess ? records : count;
}

kite_status allocate_and_attach(unsigned capacity) {
    CUDA_CHECK(cudaMalloc(&timeline_device_records, (size_t)capacity * sizeof(timeline_record)));
    CUDA_CHECK(cudaMalloc(&timeline_device_count, sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(timeline_device_count, 0, sizeof(unsigned)));
    timeline_device_capacity = capacity;
    return attach_all(timeline_device_records, timeline_device_count, capacity);
}

/* Writes the (detached) buffer's records to path; *n_records: how many. */
kite_status write_records(const char *path, unsigned *n_records) {
    unsigned count = 0;
    CUDA_CHECK(cudaMemcpy(&count, timeline_device_count, sizeof count, cudaMemcpyDeviceToHost));
    if (count > timeline_device_capacity) count = timeline_device_capacity;
    timeline_record *host = static_cast<timeline_record *>(malloc((size_t)count * sizeof(timeline_record) + 1));
    if (!host) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cuda_timeline_stop: %u records", count);
    kite_status status = KITE_OK;
    if (cudaMemcpy(host, timeline_device_records, (size_t)count * sizeof(timeline_record), cudaMemcpyDeviceToHost) !=
        cudaSuccess)
        status = kite_fail(KITE_ERROR_BACKEND, "cuda_timeline_stop: copying the records failed");
    FILE *f = status == KITE_OK ? fopen(path, "wb") : NULL;
    if (status == KITE_OK && !f) status = kite_fail(KITE_ERROR_IO, "cuda_timeline_stop: cannot open %s", path);
    if (f) {
        if (fwrite(host, sizeof(timeline_record), count, f) != count)
            status = kite_fail(KITE_ERROR_IO, "cuda_timeline_stop: writing %s failed", path);
        if (fclose(f) != 0 && status == KITE_OK)
            status = kite_fail(KITE_ERROR_IO, "cuda_timeline_stop: closing %s failed", path);
    }
    free(host);
    if (status == KITE_OK) *n_records = count;
    return status;
}
} // namespace

extern "C" kite_status cuda_timeline_start(unsigned capacity) {
    if (timeline_device_records != nullptr)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_timeline_start: a timeline is already running");
    const kite_status status = allocate_and_attach(capacity);
    if (status != KITE_OK && attach_all(nullptr, nullptr, 0) == KITE_OK) /* detached: no kernel writes there */
        (void)release_buffers(); /* the allocation's failure is the one reported */
    return status;
}

extern "C" kite_status cuda_timeline_stop(const char *path, unsigned *n_records) {
    *n_records = 0;
    if (timeline_device_records == nullptr)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_timeline_stop: no timeline is running");
    /* Kernels may still write to the buffers until they are detached: on a failure here they stay allocated. */
    CUDA_CHECK(cudaDeviceSynchronize());
    KITE_TRY(attach_all(nullptr, nullptr, 0));
    const kite_status written = write_records(path, n_records);
    const cudaError_t released = release_buffers();
    if (written == KITE_OK && released != cudaSuccess)
        return kite_fail(KITE_ERROR_BACKEND, "cuda_timeline_stop: cudaFree failed: %s", cudaGetErrorName(released));
    return written;
}
#else
extern "C" kite_status cuda_timeline_start(unsigned capacity) {
    (void)capacity;
    return kite_fail(KITE_ERROR_UNSUPPORTED,
                     "cuda_timeline_start: this build has no timeline (cmake -DKITE_TIMELINE=ON)");
}

extern "C" kite_status cuda_timeline_stop(const char *path, unsigned *n_records) {
    (void)path;
    *n_records = 0;
    return kite_fail(KITE_ERROR_UNSUPPORTED,
                     "cuda_timeline_stop: this build has no timeline (cmake -DKITE_TIMELINE=ON)");
}
#endif

/* What the CUDA backend finds on this machine (kite_backend_probe), without creating a backend. */
#include "backend/backend.h"

#include <cuda_runtime.h>
#include <stdio.h>

extern "C" void cuda_backend_probe(int32_t device, kite_backend_probe_result *out) {
    *out = kite_backend_probe_result{};
    char reason[sizeof out->reason] = "";
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        (void)cudaGetLastError(); /* not sticky: clear it so later calls do not see it */
        snprintf(out->reason, sizeof out->reason, "no CUDA GPU is usable here (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "no device found");
        return;
    }
    if (device < 0 || device >= count) {
        snprintf(out->reason, sizeof out->reason, "CUDA device %d does not exist (%d found)", (int)device, count);
        return;
    }
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        snprintf(out->reason, sizeof out->reason, "cudaGetDeviceProperties(%d) failed: %s", (int)device,
                 cudaGetErrorString(cudaGetLastError()));
        return;
    }
    snprintf(out->device_name, sizeof out->device_name, "%.*s", (int)sizeof out->device_name - 1, prop.name);
    out->compute_major = prop.major;
    out->compute_minor = prop.minor;
    out->memory_total_bytes = prop.totalGlobalMem;
    int previous = 0;
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(device) == cudaSuccess &&
        cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
        out->memory_free_bytes = free_bytes;
        out->memory_total_bytes = total_bytes;
    } else {
        (void)cudaGetLastError();
    }
    (void)cudaSetDevice(previous);
    out->available = cuda_backend_available(reason, sizeof reason) != 0 && device < count;
    if (!out->available) snprintf(out->reason, sizeof out->reason, "%s", reason);
}

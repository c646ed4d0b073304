/* Plain-C wrappers over device memory and events for the CUDA tests and the bench (cuda_ops.h). */
#include "backend/cuda/kernels/cuda_common.cuh"

extern "C" int kite_cuda_device_count(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return count;
}

extern "C" kite_status kite_cuda_malloc(void **pointer, size_t bytes) {
    *pointer = NULL;
    CUDA_CHECK(cudaMalloc(pointer, bytes));
    return KITE_OK;
}

extern "C" kite_status kite_cuda_free(void *pointer) {
    CUDA_CHECK(cudaFree(pointer));
    return KITE_OK;
}

extern "C" kite_status kite_cuda_copy_to_device(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return KITE_OK;
}

extern "C" kite_status kite_cuda_copy_to_host(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return KITE_OK;
}

extern "C" kite_status kite_cuda_memset(void *dst, int value, size_t bytes) {
    CUDA_CHECK(cudaMemset(dst, value, bytes));
    return KITE_OK;
}

extern "C" kite_status kite_cuda_synchronize(void) {
    CUDA_CHECK(cudaDeviceSynchronize());
    return KITE_OK;
}

extern "C" kite_status kite_cuda_timer_start(void **timer) {
    cudaEvent_t *events = static_cast<cudaEvent_t *>(calloc(2, sizeof(cudaEvent_t)));
    if (!events) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "kite_cuda_timer_start: out of memory");
    *timer = events;
    CUDA_CHECK(cudaEventCreate(&events[0]));
    CUDA_CHECK(cudaEventCreate(&events[1]));
    CUDA_CHECK(cudaEventRecord(events[0], 0));
    return KITE_OK;
}

extern "C" kite_status kite_cuda_timer_stop(void *timer, float *milliseconds) {
    cudaEvent_t *events = static_cast<cudaEvent_t *>(timer);
    CUDA_CHECK(cudaEventRecord(events[1], 0));
    CUDA_CHECK(cudaEventSynchronize(events[1]));
    CUDA_CHECK(cudaEventElapsedTime(milliseconds, events[0], events[1]));
    cudaEventDestroy(events[0]);
    cudaEventDestroy(events[1]);
    free(events);
    return KITE_OK;
}

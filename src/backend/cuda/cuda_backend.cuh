/* The CUDA backend as its members: the core every path reads, each path's own state, the readers' state, and the
 * rows the last step kept (a value the step's path returns, cuda_forward stores and the readers take). */
#ifndef KITE_BACKEND_CUDA_BACKEND_CUH
#define KITE_BACKEND_CUDA_BACKEND_CUH

#include "backend/cuda/batch_path.cuh"
#include "backend/cuda/cuda_core.cuh"
#include "backend/cuda/decode_path.cuh"
#include "backend/cuda/prefill_path.cuh"
#include "backend/cuda/read_results.cuh"

struct cuda_backend {
    backend base; /* first: a cuda_backend * is a backend * */
    cuda_core core;
    prefill_state prefill;
    decode_state decode;
    batch_state batch;
    results_state results;
    kept_rows kept;
    char decode_path[640]; /* cuda_decode_path's report */
};

inline cuda_backend *as_cuda(backend *b) { return reinterpret_cast<cuda_backend *>(b); }

#endif

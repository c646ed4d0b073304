/* Extra entry points of the CUDA backend for its tests and bench (plain C). */
#ifndef KITE_BACKEND_CUDA_BACKEND_INTERNAL_H
#define KITE_BACKEND_CUDA_BACKEND_INTERNAL_H

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Single-stream decode: capture the step as a CUDA graph (use_graph) and chain its kernels with
 * programmatic dependent launch (use_pdl). Defaults: both on (env KITE_CUDA_GRAPH=0 / KITE_CUDA_PDL=0
 * turn them off at creation). Drops a captured graph. */
kite_status cuda_backend_set_decode_options(backend *self, int use_graph, int use_pdl);
/* Single-stream decode as one persistent kernel (decode_persistent.cu) instead of the graph path above,
 * where the model and device suit it. Off by default (env KITE_CUDA_PERSISTENT=1 turns it on at creation):
 * correct, but not yet faster (docs/notes-cuda.md). cuda_backend_persistent_decode says whether it is on. */
kite_status cuda_backend_set_persistent_decode(backend *self, int on);
int cuda_backend_persistent_decode(backend *self);
/* Waits for all work queued by the backend (for timing). */
kite_status cuda_backend_synchronize(backend *self);

#ifdef __cplusplus
}
#endif

#endif

/* Reading a step's kept rows back (cuda_read_results.cu): its state, and the backend_ops it serves. */
#ifndef KITE_BACKEND_CUDA_READ_RESULTS_CUH
#define KITE_BACKEND_CUDA_READ_RESULTS_CUH

#include "backend/cuda/cuda_core.cuh"

struct results_state {
    int32_t *ids_device, *ids_host; /* argmax ids of kept rows that came without them (device, pinned) */
    int32_t ids_rows;               /* rows they hold */
    void *top_device, *top_host;    /* read_top's candidates and stats (device, pinned) */
    int32_t top_rows;               /* rows they hold */
    /* Overlapped decode (argmax_begin / argmax_end): begun argmaxes in order, a ring of BACKEND_ARGMAX_PENDING
     * pinned buffers, each filled by a copy on the stream and marked by its event; or, where the step published its
     * ids to mapped host memory itself (kept_rows.published), that memory and an event. */
    int32_t *begun_host[BACKEND_ARGMAX_PENDING];
    int32_t begun_capacity[BACKEND_ARGMAX_PENDING], begun_rows[BACKEND_ARGMAX_PENDING];
    cudaEvent_t begun_copied[BACKEND_ARGMAX_PENDING];
    const volatile int32_t *begun_mapped[BACKEND_ARGMAX_PENDING]; /* NULL: the copy in begun_host */
    int64_t n_begun, n_ended;
};

/* The device ids of the kept rows' argmax: where the step left them, else computed from its logits into
 * ids_device. */
kite_status kept_argmax_device(const cuda_core *core, results_state *r, const kept_rows &kept, int32_t n_rows,
                               const int32_t **ids);
kite_status read_logits(const cuda_core *core, const kept_rows &kept, float *out, int32_t n_rows);
kite_status read_top(const cuda_core *core, results_state *r, const kept_rows &kept, int32_t n_rows, int32_t k,
                     float *top_logits, int32_t *top_ids, backend_row_top *stats);
kite_status read_argmax(const cuda_core *core, results_state *r, const kept_rows &kept, int32_t *out_ids,
                        int32_t n_rows);
kite_status argmax_begin(const cuda_core *core, results_state *r, const kept_rows &kept, int32_t n_rows);
kite_status argmax_end(results_state *r, int32_t *out_ids, int32_t n_rows);
void results_free(results_state *r);

#endif

/* Reading a step's results back from the CUDA backend: the kept rows of logits whole, their top candidates, or
 * their argmax ids (a row that allows no token refused), waited for at once (argmax) or begun now and waited for
 * later (argmax_begin / argmax_end, so the host prepares the next step while this one runs). */
#include "backend/cuda/read_results.cuh"

#include <math.h>
#include <string.h>

/* A forward asked for ids only (step_batch.ids_only) kept no logits. */
static kite_status ids_only_refusal(const char *what) {
    return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: %s after a forward that kept only its argmax ids "
                     "(step_batch.ids_only)", what);
}

/* The argmax kernels report a row holding a NaN or +inf, or no finite logit, as ARGMAX_NO_TOKEN (cuda_common.cuh):
 * such a row allows no token, greedy or sampled, and the step fails here as sampling the row would. */
static kite_status refuse_rows_without_token(const int32_t *ids, int32_t n_rows) {
    for (int32_t row = 0; row < n_rows; row++)
        if (ids[row] < 0)
            return kite_fail(KITE_ERROR_INVALID_INPUT, "cuda backend: logits row %d holds a NaN or +inf, or no finite "
                             "logit (the weights or activations are not finite): no token can be chosen", (int)row);
    return KITE_OK;
}

namespace {

/* Argmax ids of `rows` rows (device, pinned). */
kite_status ensure_ids(const cuda_core *core, results_state *r, int32_t rows) {
    if (rows <= r->ids_rows) return KITE_OK;
    const int32_t capacity = grown_capacity(r->ids_rows, (int32_t)8, rows);
    CUDA_CHECK(cudaStreamSynchronize(core->stream));
    r->ids_rows = 0;
    KITE_TRY(replace_device_and_pinned(&r->ids_device, (size_t)capacity * sizeof(int32_t), &r->ids_host,
                                       (size_t)capacity * sizeof(int32_t)));
    r->ids_rows = capacity;
    return KITE_OK;
}

} // namespace

kite_status kept_argmax_device(const cuda_core *core, results_state *r, const kept_rows &kept, int32_t n_rows,
                               const int32_t **ids) {
    if (kept.argmax_ids) {
        *ids = kept.argmax_ids;
    } else {
        KITE_TRY(ensure_ids(core, r, n_rows));
        KITE_TRY(cuda_argmax_rows(kept.logits, r->ids_device, n_rows, core->config.vocab_size, core->stream));
        *ids = r->ids_device;
    }
    return KITE_OK;
}

kite_status read_logits(const cuda_core *core, const kept_rows &kept, float *out, int32_t n_rows) {
    nvtx_scope range("kite read logits");
    if (n_rows < 0 || n_rows > kept.n_rows)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: %d logits rows asked, %d kept", n_rows, kept.n_rows);
    if (n_rows == 0) return KITE_OK;
    if (!kept.logits) return ids_only_refusal("read_logits");
    CUDA_CHECK(cudaMemcpyAsync(out, kept.logits, (size_t)n_rows * (size_t)core->config.vocab_size * sizeof(float),
                               cudaMemcpyDeviceToHost, core->stream));
    CUDA_CHECK(cudaStreamSynchronize(core->stream));
    return KITE_OK;
}

static_assert(sizeof(cuda_row_top) == sizeof(backend_row_top) && CUDA_TOP_MAX == BACKEND_TOP_MAX,
              "cuda_row_top is backend_row_top");

namespace {

/* read_top's buffers for `rows` rows: on the device its copied part - candidates (logits, ids) at BACKEND_TOP_MAX
 * per row, then the stats - followed by the workspace of cuda_top_candidates; the copied part pinned on the host. */
size_t top_copied_bytes(int32_t rows) {
    return align_up((size_t)rows * (BACKEND_TOP_MAX * (sizeof(float) + sizeof(int32_t)) + sizeof(backend_row_top)), 256);
}

kite_status ensure_top(const cuda_core *core, results_state *r, int32_t rows) {
    if (rows <= r->top_rows) return KITE_OK;
    const int32_t capacity = grown_capacity(r->top_rows, (int32_t)8, rows);
    CUDA_CHECK(cudaStreamSynchronize(core->stream));
    r->top_rows = 0;
    KITE_TRY(replace_device_and_pinned(
        &r->top_device, top_copied_bytes(capacity) + cuda_top_candidates_workspace(capacity, core->config.vocab_size),
        &r->top_host, top_copied_bytes(capacity)));
    r->top_rows = capacity;
    return KITE_OK;
}

} // namespace

kite_status read_top(const cuda_core *core, results_state *r, const kept_rows &kept, int32_t n_rows, int32_t k,
                     float *top_logits, int32_t *top_ids, backend_row_top *stats) {
    nvtx_scope range("kite read top candidates");
    if (n_rows < 0 || n_rows > kept.n_rows || k <= 0 || k > BACKEND_TOP_MAX)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: read_top of %d rows (%d kept), k %d (at most %d)",
                         n_rows, kept.n_rows, k, BACKEND_TOP_MAX);
    if (n_rows == 0) return KITE_OK;
    if (!kept.logits) return ids_only_refusal("read_top");
    const int vocab = core->config.vocab_size;
    if (!cuda_top_candidates_fits(vocab, k)) { /* not ranked here: the caller reads the rows whole */
        for (int32_t row = 0; row < n_rows; row++) stats[row] = backend_row_top{-INFINITY, 0, -1, -1, 0.0};
        return KITE_OK;
    }
    KITE_TRY(ensure_top(core, r, n_rows));
    /* [n_rows][k] logits, then [n_rows][k] ids, then the stats: one copy back. */
    const size_t candidates = (size_t)n_rows * (size_t)k;
    const size_t ids_at = candidates * sizeof(float), stats_at = ids_at + candidates * sizeof(int32_t);
    const size_t bytes = stats_at + (size_t)n_rows * sizeof(cuda_row_top);
    unsigned char *device = static_cast<unsigned char *>(r->top_device);
    KITE_TRY(cuda_top_candidates(kept.logits, n_rows, vocab, k, reinterpret_cast<float *>(device),
                                 reinterpret_cast<int32_t *>(device + ids_at), reinterpret_cast<cuda_row_top *>(device + stats_at),
                                 device + top_copied_bytes(r->top_rows), core->stream));
    CUDA_CHECK(cudaMemcpyAsync(r->top_host, r->top_device, bytes, cudaMemcpyDeviceToHost, core->stream));
    CUDA_CHECK(cudaStreamSynchronize(core->stream));
    const unsigned char *host = static_cast<const unsigned char *>(r->top_host);
    memcpy(top_logits, host, candidates * sizeof(float));
    memcpy(top_ids, host + ids_at, candidates * sizeof(int32_t));
    memcpy(stats, host + stats_at, (size_t)n_rows * sizeof(backend_row_top));
    return KITE_OK;
}

kite_status read_argmax(const cuda_core *core, results_state *r, const kept_rows &kept, int32_t *out_ids,
                        int32_t n_rows) {
    nvtx_scope range("kite argmax (wait for ids)");
    if (n_rows < 0 || n_rows > kept.n_rows)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: argmax of %d rows asked, %d kept", n_rows, kept.n_rows);
    if (n_rows == 0) return KITE_OK;
    if (const volatile int32_t *mapped = kept.published) { /* the step wrote its ids to the host itself */
        CUDA_CHECK(cudaStreamSynchronize(core->stream));
        for (int32_t i = 0; i < n_rows; i++) out_ids[i] = mapped[i];
        return refuse_rows_without_token(out_ids, n_rows);
    }
    KITE_TRY(ensure_ids(core, r, n_rows)); /* ids_host */
    const int32_t *ids = NULL;
    KITE_TRY(kept_argmax_device(core, r, kept, n_rows, &ids));
    CUDA_CHECK(cudaMemcpyAsync(r->ids_host, ids, (size_t)n_rows * sizeof(int32_t), cudaMemcpyDeviceToHost, core->stream));
    CUDA_CHECK(cudaStreamSynchronize(core->stream));
    memcpy(out_ids, r->ids_host, (size_t)n_rows * sizeof(int32_t));
    return refuse_rows_without_token(out_ids, n_rows);
}

kite_status argmax_begin(const cuda_core *core, results_state *r, const kept_rows &kept, int32_t n_rows) {
    if (n_rows <= 0 || n_rows > kept.n_rows || r->n_begun - r->n_ended >= BACKEND_ARGMAX_PENDING)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: argmax_begin of %d rows (%d kept, %lld pending)",
                         n_rows, kept.n_rows, (long long)(r->n_begun - r->n_ended));
    const int slot = (int)(r->n_begun % BACKEND_ARGMAX_PENDING);
    r->begun_mapped[slot] = NULL;
    const volatile int32_t *mapped = kept.published;
    bool taken = false; /* a pending one reads the same host memory (the next step will overwrite it): copy */
    for (int64_t i = r->n_ended; i < r->n_begun && mapped; i++) {
        const int other = (int)(i % BACKEND_ARGMAX_PENDING);
        const volatile int32_t *p = r->begun_mapped[other];
        taken |= p && p < mapped + n_rows && mapped < p + r->begun_rows[other];
    }
    if (mapped && !taken) {
        CUDA_CHECK(cudaEventRecord(r->begun_copied[slot], core->stream));
        r->begun_mapped[slot] = mapped;
        r->begun_rows[slot] = n_rows;
        r->n_begun++;
        return KITE_OK;
    }
    if (n_rows > r->begun_capacity[slot]) { /* this slot's previous copy was waited for by argmax_end */
        if (r->begun_host[slot]) CUDA_CHECK(cudaFreeHost(r->begun_host[slot]));
        r->begun_host[slot] = NULL;
        r->begun_capacity[slot] = 0;
        const int32_t capacity = grown_capacity((int32_t)0, (int32_t)8, n_rows);
        CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void **>(&r->begun_host[slot]), (size_t)capacity * sizeof(int32_t),
                                 cudaHostAllocDefault));
        r->begun_capacity[slot] = capacity;
    }
    const int32_t *ids = NULL;
    KITE_TRY(kept_argmax_device(core, r, kept, n_rows, &ids));
    CUDA_CHECK(cudaMemcpyAsync(r->begun_host[slot], ids, (size_t)n_rows * sizeof(int32_t), cudaMemcpyDeviceToHost,
                               core->stream));
    CUDA_CHECK(cudaEventRecord(r->begun_copied[slot], core->stream));
    r->begun_rows[slot] = n_rows;
    r->n_begun++;
    return KITE_OK;
}

kite_status argmax_end(results_state *r, int32_t *out_ids, int32_t n_rows) {
    const int slot = (int)(r->n_ended % BACKEND_ARGMAX_PENDING);
    if (r->n_ended == r->n_begun || n_rows != r->begun_rows[slot] || !out_ids)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: argmax_end of %d rows: %s", n_rows,
                         r->n_ended == r->n_begun ? "none begun" : "not the rows begun");
    {
        nvtx_scope range("kite wait for token ids");
        CUDA_CHECK(cudaEventSynchronize(r->begun_copied[slot]));
    }
    if (r->begun_mapped[slot])
        for (int32_t i = 0; i < n_rows; i++) out_ids[i] = r->begun_mapped[slot][i];
    else
        memcpy(out_ids, r->begun_host[slot], (size_t)n_rows * sizeof(int32_t));
    r->n_ended++;
    return refuse_rows_without_token(out_ids, n_rows);
}

void results_free(results_state *r) {
    cudaFree(r->ids_device);
    cudaFreeHost(r->ids_host);
    cudaFree(r->top_device);
    cudaFreeHost(r->top_host);
    for (int i = 0; i < BACKEND_ARGMAX_PENDING; i++) {
        cudaFreeHost(r->begun_host[i]);
        if (r->begun_copied[i]) cudaEventDestroy(r->begun_copied[i]);
    }
}

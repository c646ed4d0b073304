/* Reading a step's results back from the CUDA backend: the kept rows of logits whole, their top candidates, or
 * their argmax ids, waited for at once (argmax) or begun now and waited for later (argmax_begin / argmax_end, so
 * the host prepares the next step while this one runs). */
#include "backend/cuda/cuda_backend_state.cuh"

#include <math.h>
#include <string.h>

/* A forward asked for ids only (step_batch.ids_only) kept no logits. */
static kite_status ids_only_refusal(const char *what) {
    return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: %s after a forward that kept only its argmax ids "
                     "(step_batch.ids_only)", what);
}

/* The device ids of the kept rows' argmax: where the decode graphs left them, else computed into ids_device. */
kite_status kept_argmax_device(cuda_backend *b, int32_t n_rows, const int32_t **ids) {
    if (b->kept_decode) {
        *ids = b->dec_token;
    } else if (b->kept_batch) {
        *ids = b->bat_ids;
    } else {
        KITE_TRY(ensure_logits(b, n_rows));
        KITE_TRY(cuda_argmax_rows(b->kept_logits, b->ids_device, n_rows, b->config.vocab_size, b->stream));
        *ids = b->ids_device;
    }
    return KITE_OK;
}

kite_status cuda_read_logits(backend *self, float *out, int32_t n_rows) {
    nvtx_scope range("kite read logits");
    cuda_backend *b = as_cuda(self);
    if (n_rows < 0 || n_rows > b->kept_rows)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: %d logits rows asked, %d kept", n_rows, b->kept_rows);
    if (n_rows == 0) return KITE_OK;
    if (!b->kept_logits) return ids_only_refusal("read_logits");
    CUDA_CHECK(cudaMemcpyAsync(out, b->kept_logits, (size_t)n_rows * (size_t)b->config.vocab_size * sizeof(float),
                               cudaMemcpyDeviceToHost, b->stream));
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
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

kite_status ensure_top(cuda_backend *b, int32_t rows) {
    if (rows <= b->top_rows) return KITE_OK;
    const int32_t capacity = grown_capacity(b->top_rows, (int32_t)8, rows);
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    b->top_rows = 0;
    KITE_TRY(replace_device_and_pinned(
        &b->top_device, top_copied_bytes(capacity) + cuda_top_candidates_workspace(capacity, b->config.vocab_size),
        &b->top_host, top_copied_bytes(capacity)));
    b->top_rows = capacity;
    return KITE_OK;
}

} // namespace

kite_status cuda_read_top(backend *self, int32_t n_rows, int32_t k, float *top_logits, int32_t *top_ids,
                          backend_row_top *stats) {
    nvtx_scope range("kite read top candidates");
    cuda_backend *b = as_cuda(self);
    if (n_rows < 0 || n_rows > b->kept_rows || k <= 0 || k > BACKEND_TOP_MAX)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: read_top of %d rows (%d kept), k %d (at most %d)",
                         n_rows, b->kept_rows, k, BACKEND_TOP_MAX);
    if (n_rows == 0) return KITE_OK;
    if (!b->kept_logits) return ids_only_refusal("read_top");
    const int vocab = b->config.vocab_size;
    if (!cuda_top_candidates_fits(vocab, k)) { /* not ranked here: the caller reads the rows whole */
        for (int32_t r = 0; r < n_rows; r++) stats[r] = backend_row_top{-INFINITY, 0, -1, -1, 0.0};
        return KITE_OK;
    }
    KITE_TRY(ensure_top(b, n_rows));
    /* [n_rows][k] logits, then [n_rows][k] ids, then the stats: one copy back. */
    const size_t candidates = (size_t)n_rows * (size_t)k;
    const size_t ids_at = candidates * sizeof(float), stats_at = ids_at + candidates * sizeof(int32_t);
    const size_t bytes = stats_at + (size_t)n_rows * sizeof(cuda_row_top);
    unsigned char *device = static_cast<unsigned char *>(b->top_device);
    KITE_TRY(cuda_top_candidates(b->kept_logits, n_rows, vocab, k, reinterpret_cast<float *>(device),
                                 reinterpret_cast<int32_t *>(device + ids_at), reinterpret_cast<cuda_row_top *>(device + stats_at),
                                 device + top_copied_bytes(b->top_rows), b->stream));
    CUDA_CHECK(cudaMemcpyAsync(b->top_host, b->top_device, bytes, cudaMemcpyDeviceToHost, b->stream));
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    const unsigned char *host = static_cast<const unsigned char *>(b->top_host);
    memcpy(top_logits, host, candidates * sizeof(float));
    memcpy(top_ids, host + ids_at, candidates * sizeof(int32_t));
    memcpy(stats, host + stats_at, (size_t)n_rows * sizeof(backend_row_top));
    return KITE_OK;
}

kite_status cuda_argmax(backend *self, int32_t *out_ids, int32_t n_rows) {
    nvtx_scope range("kite argmax (wait for ids)");
    cuda_backend *b = as_cuda(self);
    if (n_rows < 0 || n_rows > b->kept_rows)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: argmax of %d rows asked, %d kept", n_rows, b->kept_rows);
    if (n_rows == 0) return KITE_OK;
    if (const volatile int32_t *mapped = b->kept_published) { /* the step wrote its ids to the host itself */
        CUDA_CHECK(cudaStreamSynchronize(b->stream));
        for (int32_t i = 0; i < n_rows; i++) out_ids[i] = mapped[i];
        return KITE_OK;
    }
    KITE_TRY(ensure_logits(b, n_rows)); /* ids_host */
    const int32_t *ids = NULL;
    KITE_TRY(kept_argmax_device(b, n_rows, &ids));
    CUDA_CHECK(cudaMemcpyAsync(b->ids_host, ids, (size_t)n_rows * sizeof(int32_t), cudaMemcpyDeviceToHost, b->stream));
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    memcpy(out_ids, b->ids_host, (size_t)n_rows * sizeof(int32_t));
    return KITE_OK;
}

kite_status cuda_argmax_begin(backend *self, int32_t n_rows) {
    cuda_backend *b = as_cuda(self);
    if (n_rows <= 0 || n_rows > b->kept_rows || b->n_begun - b->n_ended >= BACKEND_ARGMAX_PENDING)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: argmax_begin of %d rows (%d kept, %lld pending)",
                         n_rows, b->kept_rows, (long long)(b->n_begun - b->n_ended));
    const int slot = (int)(b->n_begun % BACKEND_ARGMAX_PENDING);
    b->begun_mapped[slot] = NULL;
    const volatile int32_t *mapped = b->kept_published;
    bool taken = false; /* a pending one reads the same host memory (the next step will overwrite it): copy */
    for (int64_t i = b->n_ended; i < b->n_begun && mapped; i++) {
        const int other = (int)(i % BACKEND_ARGMAX_PENDING);
        const volatile int32_t *p = b->begun_mapped[other];
        taken |= p && p < mapped + n_rows && mapped < p + b->begun_rows[other];
    }
    if (mapped && !taken) {
        CUDA_CHECK(cudaEventRecord(b->begun_copied[slot], b->stream));
        b->begun_mapped[slot] = mapped;
        b->begun_rows[slot] = n_rows;
        b->n_begun++;
        return KITE_OK;
    }
    if (n_rows > b->begun_capacity[slot]) { /* this slot's previous copy was waited for by argmax_end */
        if (b->begun_host[slot]) CUDA_CHECK(cudaFreeHost(b->begun_host[slot]));
        b->begun_host[slot] = NULL;
        b->begun_capacity[slot] = 0;
        const int32_t capacity = grown_capacity((int32_t)0, (int32_t)8, n_rows);
        CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void **>(&b->begun_host[slot]), (size_t)capacity * sizeof(int32_t),
                                 cudaHostAllocDefault));
        b->begun_capacity[slot] = capacity;
    }
    const int32_t *ids = NULL;
    KITE_TRY(kept_argmax_device(b, n_rows, &ids));
    CUDA_CHECK(cudaMemcpyAsync(b->begun_host[slot], ids, (size_t)n_rows * sizeof(int32_t), cudaMemcpyDeviceToHost,
                               b->stream));
    CUDA_CHECK(cudaEventRecord(b->begun_copied[slot], b->stream));
    b->begun_rows[slot] = n_rows;
    b->n_begun++;
    return KITE_OK;
}

kite_status cuda_argmax_end(backend *self, int32_t *out_ids, int32_t n_rows) {
    cuda_backend *b = as_cuda(self);
    const int slot = (int)(b->n_ended % BACKEND_ARGMAX_PENDING);
    if (b->n_ended == b->n_begun || n_rows != b->begun_rows[slot] || !out_ids)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda backend: argmax_end of %d rows: %s", n_rows,
                         b->n_ended == b->n_begun ? "none begun" : "not the rows begun");
    {
        nvtx_scope range("kite wait for token ids");
        CUDA_CHECK(cudaEventSynchronize(b->begun_copied[slot]));
    }
    if (b->begun_mapped[slot])
        for (int32_t i = 0; i < n_rows; i++) out_ids[i] = b->begun_mapped[slot][i];
    else
        memcpy(out_ids, b->begun_host[slot], (size_t)n_rows * sizeof(int32_t));
    b->n_ended++;
    return KITE_OK;
}

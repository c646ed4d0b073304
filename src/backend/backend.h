/* The interface every compute backend implements (CPU reference, CUDA).
 *
 * One forward call serves prefill, single-stream decode and batched decode: a step batch is a list of
 * sequences, each contributing some new tokens that continue its context. Keys and values live in a
 * paged KV cache owned by the backend: KV_BLOCK positions per block, blocks named by int32 ids that the
 * engine hands out (engine/kv_cache.c keeps the free list; the backend only stores). How a backend lays
 * out a block internally is its own business.
 *
 * Host C code never includes CUDA headers: the CUDA backend exports plain C functions declared here.
 */
#ifndef KITE_BACKEND_BACKEND_H
#define KITE_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kite.h"
#include "model/qwen3.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct step_batch {
    int32_t n_seqs;
    int32_t n_tokens; /* total new tokens over all sequences */
    /* [n_tokens]: the new tokens, sequence after sequence. */
    const int32_t *token_ids;
    /* [n_seqs + 1]: the new tokens of sequence s are token_ids[seq_token_start[s] .. seq_token_start[s+1]). */
    const int32_t *seq_token_start;
    /* [n_seqs]: the sequence's context length after this step. Its new tokens take positions
     * [context_len - n_new, context_len); earlier positions are already in its KV blocks. */
    const int32_t *seq_context_len;
    /* [n_seqs]: block ids; block_tables[s][i] holds positions [i * block_size, (i + 1) * block_size).
     * Covers at least seq_context_len[s] positions. */
    const int32_t *const *block_tables;
    /* [n_seqs]: 1 when the sequence needs the logits of its last new token this step, else 0
     * (a prefill chunk that does not finish its prompt needs none). Rows come out in sequence order. */
    const uint8_t *seq_wants_logits;
    /* Overlapped greedy decode (backends with argmax_begin): when true, token_ids is not read and sequence s's
     * one new token is the argmax of row s of the previous forward's kept logits; that forward kept exactly
     * n_seqs rows, and each sequence here adds one token and wants logits. The host need not know the tokens
     * yet: the engine enqueues this step before it reads the previous one's ids. */
    bool tokens_from_argmax;
    /* The caller reads only the argmax ids of this forward's kept rows (argmax, argmax_begin / argmax_end), not their
     * logits: a backend may then skip writing the logits (CUDA: single-stream decode's screened lm_head,
     * lm_head_screen.cu) and refuse read_logits and read_top until the next forward. The ids are the same either way. */
    bool ids_only;
} step_batch;

typedef struct backend backend;

/* The weight cache's view of a backend (weights/weight_cache.h). After conversion a backend holds its weights
 * as a few runs of bytes, "segments": the CPU backend one per float32 tensor, a GPU backend its device
 * allocations (one allocation of N bytes may be one segment, or a few when N is past what one read should
 * cover). A backend that exports them lists them (list_segments) and copies each out (read_segment); one made
 * from a cache entry gets the same bytes back through a backend_segment_source instead of converting the
 * checkpoint. The names and sizes are the backend's own contract with itself: the cache stores them and
 * hands them back, and the backend checks them against what its config needs before it allocates. */
#define BACKEND_SEGMENT_NAME_MAX 64
typedef struct backend_segment {
    char name[BACKEND_SEGMENT_NAME_MAX]; /* unique within the backend; NUL-terminated */
    uint64_t size;                       /* bytes */
} backend_segment;

/* Where a backend created from a cache entry reads its segments. read copies bytes [offset, offset + size) of
 * segment `index` into host memory dst (pageable or pinned staging) and checks them against the entry's
 * checksums before it returns: on KITE_OK they are the bytes that were exported; on any failure (a checksum
 * mismatch is KITE_ERROR_INVALID_CHECKPOINT) dst holds nothing usable and the caller gives up the whole
 * creation. offset must be a multiple of chunk_bytes, and size a multiple of it or reach the segment's end,
 * so that every read covers whole checksummed chunks: a GPU backend stages chunk_bytes (or a multiple) at a
 * time, uploads each staged piece while the next is read, and never needs the segment whole in host memory. A
 * read counts its bytes in the load's progress (weights/load_progress.h), so a backend reading a source does not
 * count them again. */
typedef struct backend_segment_source {
    int32_t n_segments;
    const backend_segment *segments; /* sizes already checked against the entry's file */
    uint64_t chunk_bytes;
    kite_status (*read)(const struct backend_segment_source *self, int32_t index, uint64_t offset, void *dst,
                        size_t size);
    void *context;
} backend_segment_source;

/* The index of segment `name` in source, which must be exactly `size` bytes; fails naming the segment (absent,
 * or another size) with KITE_ERROR_INVALID_CHECKPOINT, so a mismatched entry is rebuilt, not allocated from. */
kite_status backend_segment_find(const backend_segment_source *source, const char *name, uint64_t size,
                                 int32_t *index);

/* A kept row of logits reduced where it lives to what top-k sampling needs (sampler_top_row in sampler.h),
 * so that only k values leave the device: read_top fills top_logits / top_ids [n_rows][k] with each row's n
 * best finite logits (logit descending, ids ascending on ties) and this. n = min(k, n_finite); 0 when the row
 * holds a NaN or +inf (bad_index, the first) or no finite logit; -1 when the backend could not rank the row
 * (CUDA: a vocabulary larger than its merge of slices holds, cuda_top_candidates_fits): the caller then reads
 * the row whole. */
#define BACKEND_TOP_MAX 64
typedef struct backend_row_top {
    float max_logit;
    int32_t n_finite;
    int32_t n;
    int32_t bad_index;  /* -1: none */
    double log_sum_exp; /* log(sum_i exp(logit_i - max_logit)) over the whole row */
} backend_row_top;

typedef struct backend_ops {
    const char *name; /* "cpu", "cuda" */
    void (*destroy)(backend *self);
    /* Allocates storage for n_blocks KV blocks of block_size positions each, for all layers.
     * Called once, before the first forward. */
    kite_status (*kv_reserve)(backend *self, int32_t n_blocks, int32_t block_size);
    /* Runs the model over the batch, appends the new keys/values to the cache, and keeps the logits of
     * the sequences that want them (n_rows = number of seq_wants_logits set) until the next forward. */
    kite_status (*forward)(backend *self, const step_batch *batch);
    /* Copies the kept logits to the host: rows x vocab_size floats, in sequence order. */
    kite_status (*read_logits)(backend *self, float *out, int32_t n_rows);
    /* The argmax of each kept row (ties: the lowest id), computed where the logits live. A row that allows no
     * token (a NaN or +inf in it, or no finite logit) gets BACKEND_NO_TOKEN, and the call then fails with
     * KITE_ERROR_INVALID_INPUT naming the first such row, having written every row's id: a caller that serves
     * each row on its own (the engine) ends only those rows' requests, one that needs every row stops. */
    kite_status (*argmax)(backend *self, int32_t *out_ids, int32_t n_rows);
    /* Device memory in bytes that is free for the KV cache now (0 and total 0 for the host backend). */
    kite_status (*memory_info)(backend *self, size_t *free_bytes, size_t *total_bytes);
    /* What the backend runs on, for reports ("NVIDIA H200", "cpu (16 threads)"). May be NULL. */
    const char *(*device_name)(backend *self);
    /* How decode steps run with the settings in effect (kernels, and the contexts or batch sizes each takes),
     * for benchmark rows, so a row says which code it timed. May be NULL (one path only). */
    const char *(*decode_path)(backend *self);
    /* The kept rows reduced to their k best logits (0 < k <= BACKEND_TOP_MAX; see backend_row_top). May be
     * NULL: the caller reads whole rows. */
    kite_status (*read_top)(backend *self, int32_t n_rows, int32_t k, float *top_logits, int32_t *top_ids,
                            backend_row_top *stats);
    /* Overlapped greedy decode; both NULL where a backend does not offer it (then tokens_from_argmax is refused).
     * argmax_begin starts the argmax of the kept rows (as argmax) and its way to the host without waiting for
     * it; argmax_end waits for the oldest begun one and writes its n_rows ids (n_rows as begun), failing as
     * argmax does for a row that allows no token (argmax_begin does not fail for one). A tokens_from_argmax
     * forward after such a row computes something for it that no one reads (its request ends). At most
     * BACKEND_ARGMAX_PENDING may be begun and not ended: the engine begins step n's, enqueues step n + 1 with
     * tokens_from_argmax, begins that one's, then ends step n's while step n + 1 runs. */
    kite_status (*argmax_begin)(backend *self, int32_t n_rows);
    kite_status (*argmax_end)(backend *self, int32_t *out_ids, int32_t n_rows);
} backend_ops;

/* The weight cache's export of a backend (see backend_segment). list_segments writes up to `capacity`
 * segments, in a fixed order, and sets *n to how many the backend holds (call it with capacity 0 first to size
 * the array). read_segment copies bytes [offset, offset + size) of segment `index` of that order into host
 * memory (the cache writer calls it one chunk at a time, so a device backend copies through a bounded staging
 * buffer). */
typedef struct backend_segment_ops {
    kite_status (*list_segments)(backend *self, backend_segment *segments, int32_t capacity, int32_t *n);
    kite_status (*read_segment)(backend *self, int32_t index, uint64_t offset, void *dst, size_t size);
} backend_segment_ops;

#define BACKEND_ARGMAX_PENDING 2

/* The id argmax gives a row that allows no token. */
#define BACKEND_NO_TOKEN (-1)

/* Why a row allows no token: its first NaN or +inf, or that no logit is finite. */
typedef struct backend_no_token {
    int32_t bad_index; /* the first NaN or +inf; -1: every logit is -inf */
    bool is_nan;       /* logits[bad_index] is NaN, else +inf */
} backend_no_token;

/* Says why row `row` of the ids the last argmax or argmax_end wrote is BACKEND_NO_TOKEN. Reached only for such
 * rows, so it costs the step path nothing. */
typedef kite_status (*backend_explain_no_token)(backend *self, int32_t row, backend_no_token *out);

/* Implementations embed this as their first member. */
struct backend {
    const backend_ops *ops;
    const qwen3_config *config;
    /* NULL where the backend does not export its weights: its loads are then never cached. Apart from ops
     * because it serves creation (the weight cache), not running the model. */
    const backend_segment_ops *segments;
    /* NULL where the backend does not keep the reason (CUDA: its argmax kernels report only BACKEND_NO_TOKEN);
     * the engine then says what the row may hold without the index. Apart from ops because it serves a
     * message, not running the model. */
    backend_explain_no_token explain_no_token;
    /* How the KV cache holds keys and values (backend_params.kv_cache_dtype), for the pool's sizing and reports. */
    kite_kv_cache_dtype kv_cache_dtype;
};

typedef struct backend_params {
    int32_t n_threads; /* CPU: OpenMP threads (0 = all cores) */
    int32_t device;    /* CUDA: device ordinal */
    /* CPU only, for numerical studies: round activations to bf16 wherever the CUDA prefill path stores
     * them in bf16 (GEMM inputs and outputs, the KV cache, attention probabilities), so the float32 oracle
     * can also say how much of a GPU difference bf16 storage alone explains. Off (0) for normal use. */
    int32_t emulate_bf16_activations;
    /* The linear weights' form (kite_load_params.weights); quant/fp8_weights.h says what each gives. */
    kite_weights weights;
    /* How the KV cache holds keys and values (kite_load_params.kv_cache_dtype): a backend that does not implement
     * a dtype refuses it at creation with KITE_ERROR_UNSUPPORTED. */
    kite_kv_cache_dtype kv_cache_dtype;
    /* Where creation reports the checkpoint bytes it has converted (weights/load_progress.h); may be NULL. */
    struct load_progress *progress;
} backend_params;

/* Whether the backend offers overlapped greedy decode (argmax_begin / argmax_end); the engine uses it unless
 * KITE_ENGINE_OVERLAP=0 (util/options.h). */
bool backend_offers_overlap(const backend *b);
/* Bytes of KV cache for one position over all layers (K and V), at the backend's storage precision. */
size_t kv_bytes_per_position(const qwen3_config *config, size_t element_size);
/* The same for an fp8 cache: per (token, kv head) head_dim one-byte codes and one float32 scale, for K and V. */
size_t kv_fp8_bytes_per_position(const qwen3_config *config);
/* Bytes of KV cache for one position on backend b as it stores them: the CPU backend keeps float32 (with an fp8
 * cache, the float32 values of the fp8 round trip), a GPU backend bf16 or fp8 codes and scales. */
size_t backend_kv_bytes_per_position(const backend *b);

/* The CPU reference backend: float32 everywhere, weights widened at creation (the linear layers' as
 * params->weights asks: quant/fp8_weights.h). */
kite_status cpu_backend_create(const qwen3_config *config, const qwen3_weights *weights,
                               const backend_params *params, backend **out);
/* The CPU backend from the segments its list_segments exported (one per float32 tensor, named as the checkpoint
 * names the tensor), without reading or converting a checkpoint. Any segment missing or of another size than
 * config implies fails before it is allocated. params->weights is not read: the key of the entry says which
 * mode's bytes these are. */
kite_status cpu_backend_create_from_segments(const qwen3_config *config, const backend_segment_source *source,
                                             const backend_params *params, backend **out);
/* The string that tells apart the bytes backends of one kind hold on different machines, for the weight cache's
 * key: the CPU backend's float32 tensors depend only on the byte order and float format, so it is the machine
 * name (uname -m: "x86_64"); the CUDA backend's is "sm_MN" of the device's compute capability (its layouts and
 * kernels are compiled per architecture). Fails with KITE_ERROR_UNSUPPORTED when the device cannot be queried. */
kite_status backend_cache_arch(kite_backend_kind kind, int32_t device, char *out, size_t capacity);

/* The CUDA backend. Built only when nvcc was found (KITE_HAVE_CUDA); otherwise these report
 * KITE_ERROR_UNSUPPORTED. With params->weights KITE_WEIGHTS_BF16 it holds bf16 linear weights (an FP8 checkpoint
 * dequantized on the host); with KITE_WEIGHTS_FP8 E4M3 codes with 128x128 block scales, the values the CPU backend
 * computes on in that mode (W8A16: activations are never quantized). cuda_backend_available() is false when no
 * usable GPU is present, and then fills reason with why (for `kite info` and --backend auto). */
int cuda_backend_available(char *reason, size_t reason_capacity);
/* kite_backend_probe for CUDA device `device`: out->available and reason as cuda_backend_available; the device's
 * name, compute capability and memory whenever the device exists. */
void cuda_backend_probe(int32_t device, kite_backend_probe_result *out);
kite_status cuda_backend_create(const qwen3_config *config, const qwen3_weights *weights,
                                const backend_params *params, backend **out);
/* The CUDA backend from the segments its list_segments exported: its one weight allocation, byte for byte, as
 * "weights.0", "weights.1", ... of at most 1 GiB each (cuda_weight_layout.h), without reading or converting a
 * checkpoint. The count and every size are checked against the layout config implies (tie_word_embeddings
 * included, and params->weights: an fp8 entry never fits the bf16 layout, nor the reverse) before anything is
 * allocated. A failed read frees everything and returns its status (the caller rebuilds from the checkpoint). */
kite_status cuda_backend_create_from_segments(const qwen3_config *config, const backend_segment_source *source,
                                              const backend_params *params, backend **out);

#ifdef __cplusplus
}
#endif

#endif

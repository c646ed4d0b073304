/* kite: run Qwen3 dense models from a Hugging Face checkpoint directory, on CUDA or the CPU.
 *
 * The one public header. Conventions:
 * - Every function that can fail returns a kite_status; kite_last_error() gives one line naming what is
 *   wrong and where (file, tensor, field). The message is kept per thread.
 * - Handles are opaque; parameter structs are filled by their *_default() function, then adjusted.
 * - Threads. kite runs work on OpenMP threads inside its calls but takes no locks around its handles:
 *   - kite_last_error() is per thread: read it on the thread whose call failed, before that thread's next call.
 *   - A kite_engine is single-threaded: all of its functions (submit, cancel, step, run, idle, stats, timings,
 *     free, kite_chat_submit) must be called by one thread at a time; a caller that shares an engine holds a
 *     lock around each call. Callbacks run inside kite_engine_submit/cancel/step/run, on the calling thread,
 *     and must not call into that engine (cancel a request after the step returns). kite_engine_submit,
 *     _cancel, _step and _run (and so kite_chat_submit) enforce this: one called while another of them is
 *     running on the engine, from a callback or another thread, fails with KITE_ERROR_INVALID_ARGUMENT and
 *     changes nothing; the other functions are not checked.
 *   - A kite_model is read-only after it is loaded, but for its engine: kite_model_get_info, kite_tokenize,
 *     kite_detokenize, kite_model_tokenizer, kite_model_chat and kite_chat_render may run on any threads at
 *     once, also while another thread steps the model's engine. kite_engine_create, kite_engine_free and
 *     kite_bench_run use the model's backend: one of them at a time per model. A model has at most one engine
 *     (kite_engine_create refuses a second); kite_model_free comes after every other call on the model and
 *     after kite_engine_free.
 *   - A kite_tokenizer and a kite_chat are read-only once loaded: any number of threads may encode, decode and
 *     render with one handle at once. The parameter structs and results are plain values.
 */
#ifndef KITE_H
#define KITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KITE_VERSION_STRING "0.1.0"

typedef enum kite_status {
    KITE_OK = 0,
    KITE_ERROR_INVALID_ARGUMENT = 1,  /* a caller passed something unusable */
    KITE_ERROR_IO = 2,                /* a file could not be opened, read or mapped */
    KITE_ERROR_INVALID_CHECKPOINT = 3, /* config.json or safetensors is damaged or inconsistent */
    KITE_ERROR_INVALID_TOKENIZER = 4, /* tokenizer.json is damaged */
    KITE_ERROR_UNSUPPORTED = 5,       /* well-formed, but a feature kite does not implement */
    KITE_ERROR_OUT_OF_MEMORY = 6,
    KITE_ERROR_BACKEND = 7,           /* a CUDA / cuBLAS / device failure */
    KITE_ERROR_INVALID_INPUT = 8,     /* bad text or token ids */
    KITE_ERROR_CAPACITY = 9,          /* a request can never fit (context or KV cache) */
    KITE_ERROR_INVALID_TEMPLATE = 10, /* a chat template is damaged or uses a construct kite does not implement */
} kite_status;

/* A short name for the status ("invalid checkpoint"). */
const char *kite_status_string(kite_status status);
/* The message of the last failure on this thread ("" if none). */
const char *kite_last_error(void);

/* Whether this build contains the CUDA backend (it may still find no usable GPU at run time). */
bool kite_built_with_cuda(void);

/* This build: the library's version ("0.1.0"), the source commit it was built from (`git describe`, "-dirty"
 * when the tree had changes) and its CMake build type. Static strings. */
const char *kite_version(void);
const char *kite_build_commit(void);
const char *kite_build_type(void);

typedef enum kite_backend_kind {
    KITE_BACKEND_AUTO = 0, /* CUDA when this build has it, a usable GPU is present and its kernels implement
                              the model's shapes; else the CPU */
    KITE_BACKEND_CPU = 1,  /* float32 reference */
    KITE_BACKEND_CUDA = 2,
} kite_backend_kind;

/* What a backend finds on this machine, without loading a model. */
typedef struct kite_backend_probe_result {
    bool available;              /* a model can be loaded on it here */
    char reason[256];            /* why not, when !available ("no CUDA GPU is usable here (...)") */
    char device_name[128];       /* "NVIDIA H200"; "cpu" for the CPU backend */
    int32_t compute_major;       /* CUDA compute capability (0 for the CPU) */
    int32_t compute_minor;
    size_t memory_total_bytes;   /* device memory (0 for the CPU) */
    size_t memory_free_bytes;
    int32_t n_threads;           /* CPU: the threads it would use (0 for CUDA) */
} kite_backend_probe_result;

/* Fills out for one backend kind (KITE_BACKEND_CPU or KITE_BACKEND_CUDA) and device ordinal (CUDA). An
 * unavailable backend is not a failure: out->available is false and out->reason says why. Fails only on a bad
 * kind or a NULL out. */
kite_status kite_backend_probe(kite_backend_kind kind, int32_t device, kite_backend_probe_result *out);

/* ---- runtime switches ----------------------------------------------------------------------------- */

/* kite's environment switches (KITE_CUDA_GRAPH=0, ...), each read once when a model's backend or an engine is
 * created; docs/OPTIONS.md lists them. A value out of its range makes that creation fail with a message naming
 * the switch. These functions list the registry, for `kite info --options`. */
typedef struct kite_option_info {
    const char *name;          /* the environment variable */
    bool is_bool;              /* 0 or 1; else an integer in [min, max] */
    int32_t default_value;
    int32_t min;
    int32_t max;
    const char *doc;           /* one line */
    const char *environment;   /* the variable's text in this process's environment, NULL when unset or empty */
    int32_t value;             /* the value in effect (the default when unset or invalid) */
    bool valid;                /* false when environment is set but not a value in range */
} kite_option_info;

int32_t kite_option_count(void);
/* index in [0, kite_option_count()). Static strings, but environment, which is valid until the environment
 * changes. */
kite_status kite_option_get(int32_t index, kite_option_info *out);

/* Frees memory that kite returned to the caller (token id arrays, text). */
void kite_free(void *pointer);

/* ---- models --------------------------------------------------------------------------------------- */

typedef struct kite_model kite_model;

/* How the layers' linear weights (q/k/v/o/gate/up/down_proj) are held; embeddings, norms and lm_head stay
 * as stored. docs/FP8.md says what each backend does with each checkpoint. */
typedef enum kite_weights {
    KITE_WEIGHTS_BF16 = 0, /* as stored; an FP8 checkpoint's weights dequantized to bf16 */
    KITE_WEIGHTS_FP8 = 1,  /* fp8 E4M3 with one scale per 128x128 block: quantized at load from a bf16
                              checkpoint, as stored from an FP8 one */
} kite_weights;

/* How the KV cache holds keys and values. docs/ARCHITECTURE.md ("The KV cache") says what each backend stores. */
typedef enum kite_kv_cache_dtype {
    KITE_KV_CACHE_BF16 = 0, /* as the backend computes them (the CPU backend: float32) */
    KITE_KV_CACHE_FP8 = 1,  /* E4M3 codes with one float32 scale per (token, kv head), for K and for V
                               (quant/fp8_kv.h): quantized when written, dequantized when attention reads them */
} kite_kv_cache_dtype;

/* What a load reports while it runs (kite_load_params.on_load_event), so a front end can show progress. A load
 * goes through one or two stages: the weights come from the checkpoint (read and converted) or from a weight
 * cache entry, and after a conversion the entry is filled. */
typedef enum kite_load_stage {
    KITE_LOAD_STAGE_CHECKPOINT = 0, /* reading and converting the checkpoint's weights onto the backend */
    KITE_LOAD_STAGE_CACHE_READ = 1, /* reading a weight cache entry onto the backend */
    KITE_LOAD_STAGE_CACHE_FILL = 2, /* writing the converted weights to a weight cache entry */
} kite_load_stage;

typedef enum kite_load_event_kind {
    KITE_LOAD_EVENT_PROGRESS = 0, /* bytes_done of bytes_total so far (at most about ten a second) */
    KITE_LOAD_EVENT_DONE = 1,     /* the stage finished: bytes_done bytes in `seconds` */
    KITE_LOAD_EVENT_NOTICE = 2,   /* one line in message: a cache entry rejected and rebuilt, a cache folder that
                                     cannot be used, a fill that failed; the load goes on */
} kite_load_event_kind;

typedef struct kite_load_event {
    kite_load_event_kind kind;
    kite_load_stage stage;
    uint64_t bytes_done;
    uint64_t bytes_total;
    double seconds;      /* since the stage began */
    const char *message; /* NOTICE only (no newline; valid during the callback), else NULL */
} kite_load_event;

/* Called on the loading thread. With no callback, a NOTICE goes to stderr as "kite: <message>" and progress is
 * not reported: the library says nothing else on stderr, but a rebuilt cache entry should not pass unseen. */
typedef void (*kite_load_callback)(const kite_load_event *event, void *user_data);

typedef struct kite_load_params {
    kite_backend_kind backend;
    int32_t n_threads;        /* CPU threads (0 = all cores) */
    int32_t device;           /* CUDA device ordinal */
    kite_weights weights;     /* default KITE_WEIGHTS_BF16 */
    kite_kv_cache_dtype kv_cache_dtype; /* default KITE_KV_CACHE_BF16 */
    int32_t max_context;      /* lowers the model's context limit (0 = the limit config.json gives: YaRN's factor x
                                 original_max_position_embeddings, else max_position_embeddings); a value above
                                 it is refused with KITE_ERROR_INVALID_ARGUMENT */
    const char *rope_scaling; /* NULL, or JSON text of a rope_scaling object that replaces config.json's rope
                                 scaling, validated as config.json's is: {"rope_type":"yarn","factor":4.0,
                                 "original_max_position_embeddings":32768} (as vLLM's --hf-overrides
                                 '{"rope_scaling": ...}'); read during the load only */
    const char *weight_cache; /* the weight cache folder (docs/weight-cache.md): NULL = the default,
                                 $XDG_CACHE_HOME/kite or else ~/.cache/kite; "off" = no cache. A folder that
                                 cannot be used is a NOTICE and the load goes on uncached */
    kite_load_callback on_load_event; /* NULL: see kite_load_callback */
    void *load_event_user_data;
} kite_load_params;

kite_load_params kite_load_params_default(void);

/* Loads a Hugging Face Qwen3 checkpoint directory (config.json, model.safetensors or shards with
 * model.safetensors.index.json, tokenizer.json) and uploads its weights to the chosen backend.
 * Everything is validated before anything large is allocated. */
kite_status kite_model_load(const char *dir, const kite_load_params *params, kite_model **out);

/* A model of a named shape ("qwen3-0.6b-base", "qwen3-1.7b-base", "qwen3-4b-base", "qwen3-8b-base",
 * "tiny", "tiny-vocab1k") with random weights drawn from seed, and no tokenizer: for benchmarks and tests. */
kite_status kite_model_load_dummy(const char *shape, uint64_t seed, const kite_load_params *params,
                                  kite_model **out);
void kite_model_free(kite_model *model);

typedef struct kite_model_info {
    int32_t vocab_size;
    int32_t n_layers;
    int32_t hidden_size;
    int32_t max_context;      /* the context limit: a prompt has at most max_context - 1 tokens */
    int32_t n_eos_ids;
    const int32_t *eos_ids;
    bool has_tokenizer;
    const char *backend_name; /* "cpu" or "cuda" */
    size_t n_parameters;
} kite_model_info;

kite_model_info kite_model_get_info(const kite_model *model);

/* ---- the weight cache ------------------------------------------------------------------------------ */

/* One entry of a weight cache folder, as kite_weight_cache_list reads its header (the data is not checked:
 * a load does that). Strings are valid until kite_weight_cache_list_free. */
typedef struct kite_weight_cache_entry {
    const char *file;    /* the entry's path */
    const char *model;   /* the checkpoint folder it was made from */
    const char *weights; /* "bf16", "fp8" */
    const char *backend; /* "cpu", "cuda" */
    const char *arch;    /* the backend's architecture ("x86_64", "sm_90") */
    uint64_t bytes;      /* the entry's file size */
    int64_t created;     /* Unix time of the fill */
    const char *problem; /* NULL, or why the entry cannot be used (damaged header, another format version); the
                            other strings are then empty */
} kite_weight_cache_entry;

/* The entries of folder dir (NULL: the default folder) in file name order. A folder that does not exist has no
 * entries. */
kite_status kite_weight_cache_list(const char *dir, kite_weight_cache_entry **entries, size_t *n_entries);
void kite_weight_cache_list_free(kite_weight_cache_entry *entries, size_t n_entries);
/* Removes every entry of folder dir (NULL: the default), and the temporary files of fills that did not finish;
 * nothing else in the folder. */
kite_status kite_weight_cache_clear(const char *dir, size_t *n_removed);
/* The folder a NULL kite_load_params.weight_cache means, into out; KITE_ERROR_IO when neither XDG_CACHE_HOME nor
 * HOME is set. */
kite_status kite_weight_cache_default_dir(char *out, size_t capacity);

/* Text <-> token ids through the checkpoint's tokenizer.json (byte-level BPE, exactly as Hugging Face).
 * Results are allocated with malloc: release them with kite_free(). */
kite_status kite_tokenize(const kite_model *model, const char *text, size_t length, int32_t **ids, size_t *n_ids);
kite_status kite_detokenize(const kite_model *model, const int32_t *ids, size_t n_ids, char **text, size_t *length);

/* ---- tokenizer ------------------------------------------------------------------------------------ */

/* A checkpoint's tokenizer on its own, without loading weights (kite tokenize / detokenize), or a model's.
 * Thread safety: a kite_tokenizer is read-only once loaded; any number of threads may encode and decode
 * with one handle at once. */
typedef struct kite_tokenizer kite_tokenizer;

/* Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json (the eos token); nothing else in
 * DIR is read. A missing file is KITE_ERROR_IO, a damaged one KITE_ERROR_INVALID_TOKENIZER, both naming
 * the file. Release it with kite_tokenizer_free(). */
kite_status kite_tokenizer_load(const char *dir, kite_tokenizer **out);
void kite_tokenizer_free(kite_tokenizer *tokenizer);

/* The model's own tokenizer, borrowed: valid while the model lives, not to be freed. NULL for a model
 * without one (kite_model_load_dummy). */
const kite_tokenizer *kite_model_tokenizer(const kite_model *model);

/* Number of ids, added tokens included (the largest id + 1). */
int32_t kite_tokenizer_vocab_size(const kite_tokenizer *tokenizer);

/* As kite_tokenize / kite_detokenize: *ids (NULL when *n_ids is 0) and *text (NUL-terminated) are
 * allocated with malloc: release them with kite_free(). An id outside the vocabulary is
 * KITE_ERROR_INVALID_INPUT. */
kite_status kite_tokenizer_encode(const kite_tokenizer *tokenizer, const char *text, size_t length, int32_t **ids,
                                  size_t *n_ids);
kite_status kite_tokenizer_decode(const kite_tokenizer *tokenizer, const int32_t *ids, size_t n_ids, char **text,
                                  size_t *length);

/* The bytes one token decodes to alone (a piece of text, possibly part of a UTF-8 sequence; an added
 * token gives its content), borrowed from the tokenizer: valid while it lives. An id outside the
 * vocabulary is KITE_ERROR_INVALID_INPUT. */
kite_status kite_tokenizer_token_bytes(const kite_tokenizer *tokenizer, int32_t id, const char **bytes,
                                       size_t *length);

/* ---- generation ------------------------------------------------------------------------------------ */

typedef struct kite_sampling {
    float temperature;        /* 0 = greedy */
    int32_t top_k;            /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* > 0, 1 = off; over the prompt and generated tokens (vLLM): a positive logit of a
                                 token seen is divided by it, a negative one multiplied */
    uint64_t seed;            /* same seed, same tokens, alone or batched with other requests */
    bool fresh_seed;          /* the request gives no seed: one is drawn from the system's entropy at submit
                                 (OpenAI's and vLLM's request without `seed`); seed must then be 0 */
    float presence_penalty;   /* [-2, 2], 0 = off; subtracted once from the logit of every token generated so far
                                 (OpenAI's; the prompt does not count, as in vLLM) */
    float frequency_penalty;  /* [-2, 2], 0 = off; subtracted from a token's logit once per time it was generated */
} kite_sampling;

kite_sampling kite_sampling_default(void); /* greedy */

typedef enum kite_finish_reason {
    KITE_FINISH_NONE = 0,      /* still running */
    KITE_FINISH_LENGTH = 1,    /* max_tokens reached, or the context limit */
    KITE_FINISH_STOP = 2,      /* an eos id or a stop string */
    KITE_FINISH_CANCELLED = 3, /* kite_engine_cancel() */
    KITE_FINISH_CAPACITY = 4,  /* the request can never fit in the KV cache or context */
    KITE_FINISH_ERROR = 5,     /* the request's row of logits allows no token (a NaN or +inf in it, or every logit
                                  -inf: the weights or activations are not finite); kite_token_event.error says
                                  which. Only this request ends: the others in the step go on unchanged */
} kite_finish_reason;

const char *kite_finish_reason_string(kite_finish_reason reason); /* "length", "stop", ... */

typedef int64_t kite_request_id;

#define KITE_MAX_LOGPROBS 20 /* the most top log-probabilities a request can ask for per token */
#define KITE_MAX_STOP_IDS 16  /* the most stop ids a request can give */
#define KITE_MAX_LOGIT_BIAS 300 /* the most logit_bias entries a request can give */
#define KITE_MAX_INSERT_IDS 64 /* the most ids a request's insertion can hold */

/* One entry of a request's logit_bias (OpenAI's map from token id to bias). */
typedef struct kite_logit_bias {
    int32_t token; /* in [0, vocab_size) */
    float bias;    /* in [-100, 100]; added to the token's logit */
} kite_logit_bias;

/* What a request produced in one step. `text` is the newly completed text (it may be empty while a
 * UTF-8 sequence or a possible stop string is held back); all text of a request, concatenated, equals
 * its final text. The pointers are valid only during the callback. */
typedef struct kite_token_event {
    kite_request_id request;
    int32_t token;              /* -1 on a final event that carries no token (cancel, capacity, error) */
    const char *text;
    size_t text_length;
    float logprob;              /* log-softmax of the raw logits at `token`: before logit_bias, min_tokens,
                                   penalties and temperature (vLLM's default logprobs_mode, raw_logprobs) */
    int32_t n_top;              /* the request's n_logprobs */
    const int32_t *top_ids;     /* n_top ids, best first */
    const float *top_logprobs;
    kite_finish_reason finish;  /* non-zero on the request's last event */
    const char *error;          /* KITE_FINISH_ERROR: one line saying what the row held ("logits[17] is NaN ...");
                                   NULL otherwise */
    const int32_t *inserted_ids; /* the request's insertion (kite_request.insert_ids), when `token` triggered it: */
    int32_t n_inserted;         /* these ids follow `token` in the sequence and their text follows its text in
                                   `text`; they were not sampled and have no logprobs. 0 on every other event */
} kite_token_event;

typedef void (*kite_token_callback)(const kite_token_event *event, void *user_data);

typedef struct kite_request {
    const int32_t *prompt_ids; /* either token ids ... */
    size_t n_prompt_ids;
    const char *prompt_text;   /* ... or text, tokenized by the model's tokenizer (ids win when both) */
    size_t prompt_text_length;
    kite_sampling sampling;
    int32_t max_tokens;        /* new tokens at most; 0 = until eos or the context limit */
    const char *const *stop_strings;
    int32_t n_stop_strings;
    const int32_t *stop_ids;   /* more ids that end the request like an eos id, even with ignore_eos (at most */
    int32_t n_stop_ids;        /* KITE_MAX_STOP_IDS; kite_chat_stop_ids gives a chat's) */
    bool ignore_eos;           /* the model's eos ids do not end the request (stop_ids still do) */
    int32_t min_tokens;        /* >= 0, at most max_tokens when that is set: before this many tokens, the eos ids
                                  (unless ignore_eos) and stop ids cannot be chosen (their logits are -inf, as in
                                  vLLM) and stop strings are not looked for */
    const kite_logit_bias *logit_bias; /* added to the logits before sampling; at most KITE_MAX_LOGIT_BIAS entries, */
    int32_t n_logit_bias;              /* each token once; copied at submit */
    int32_t n_logprobs;        /* top log-probabilities reported per token (0..KITE_MAX_LOGPROBS), raw as `logprob` */
    /* An insertion (none when n_insert_ids is 0): the first time the request generates insert_after, and does not
     * end with it (a stop id, eos, a stop string, max_tokens), insert_ids are appended after it as forced tokens.
     * They are computed in the next step(s) as prompt tokens are (chunked prefill, prefix cache; a preempted
     * request recomputes them), are not sampled (no logprobs, not counted by max_tokens or min_tokens) and come in
     * that token's event (kite_token_event.inserted_ids, their text in its text). The sampler sees them as prompt
     * tokens (repetition_penalty counts them, presence and frequency penalties do not). When they would leave no
     * room in the context for one more token, the request ends there with KITE_FINISH_LENGTH instead. */
    int32_t insert_after;      /* a token id in [0, vocab_size) */
    const int32_t *insert_ids; /* at most KITE_MAX_INSERT_IDS ids in [0, vocab_size); copied at submit */
    int32_t n_insert_ids;
    kite_token_callback on_token;
    void *user_data;
} kite_request;

kite_request kite_request_default(void);

typedef struct kite_engine kite_engine;

typedef struct kite_engine_params {
    int32_t max_sequences;       /* sequences in one step at most (default 256) */
    int32_t max_step_tokens;     /* new tokens in one step at most: the chunked-prefill budget (default 2048) */
    size_t kv_cache_bytes;       /* 0 = kv_cache_fraction of free device memory (GPU) or enough for
                                    max_context tokens of one sequence plus headroom (CPU) */
    float kv_cache_fraction;     /* default 0.9 */
    int32_t max_context;         /* 0 = the model's context limit (kite_model_info.max_context); lower values lower
                                    it, higher ones are refused */
    int32_t kv_block_size;       /* positions per KV block (default 128) */
    bool prefix_cache;           /* automatic prefix caching (default true): full KV blocks are kept after their
                                    request and shared by later requests whose tokens begin the same way, so those
                                    compute only the rest (docs/ARCHITECTURE.md, Prefix caching); the tokens are
                                    the same either way */
} kite_engine_params;

kite_engine_params kite_engine_params_default(void);

/* One engine per model at a time: the engine owns the model backend's KV cache. */
kite_status kite_engine_create(kite_model *model, const kite_engine_params *params, kite_engine **out);
void kite_engine_free(kite_engine *engine);

/* Queues a request; it joins the running batch at the next step. The prompt and stop strings are copied.
 * A prompt of max_context tokens or more (kite_engine_stats.max_context: it leaves no room for a generated
 * token) is refused with KITE_ERROR_CAPACITY, its message naming the prompt's length, the limit and how to raise
 * it; a prompt the whole KV cache cannot hold is accepted and ends with KITE_FINISH_CAPACITY. */
kite_status kite_engine_submit(kite_engine *engine, const kite_request *request, kite_request_id *id);
/* Ends a request: its blocks are freed within one step and its callback gets KITE_FINISH_CANCELLED. */
kite_status kite_engine_cancel(kite_engine *engine, kite_request_id id);
/* One scheduler step: picks prefill chunks and decode tokens, runs the model once, samples, and calls
 * the callbacks. Does nothing when idle. A request whose row of logits allows no token ends with
 * KITE_FINISH_ERROR and the step goes on for the others (the step itself does not fail). */
kite_status kite_engine_step(kite_engine *engine);
/* Steps until no request is left. */
kite_status kite_engine_run(kite_engine *engine);
bool kite_engine_idle(const kite_engine *engine);

typedef struct kite_engine_stats {
    int32_t kv_block_size;
    int32_t kv_blocks_total;
    int32_t kv_blocks_free;         /* blocks no request holds: truly free ones and kv_blocks_cached */
    size_t kv_capacity_tokens;      /* kv_blocks_total * kv_block_size */
    int32_t max_concurrent_full;    /* sequences of max_context tokens that fit at once */
    int32_t max_context;
    int32_t running;                /* requests in the batch */
    int32_t waiting;                /* queued or preempted */
    int64_t preemptions;            /* total so far */
    int64_t steps;
    int64_t steps_ahead;            /* greedy decode steps enqueued before the previous step's ids were read
                                       (overlapped decode; KITE_ENGINE_OVERLAP=0 turns it off) */
    /* Prefix caching (kite_engine_params.prefix_cache): */
    int32_t kv_blocks_cached;       /* of kv_blocks_free, those holding a cached prefix: a request with that prefix
                                       takes them back, any other evicts them (least recently freed first) when no
                                       block is truly free. Idle, kv_blocks_free == kv_blocks_total */
    bool prefix_cache;              /* on in this engine */
    int64_t prefix_cache_queried_tokens; /* tokens of the requests admitted (a resumed one counts again) */
    int64_t prefix_cache_hit_tokens;     /* of those, the tokens found in the cache and not computed */
    int64_t prefix_cache_evictions;      /* cached blocks reused for other content */
} kite_engine_stats;

kite_engine_stats kite_engine_get_stats(const kite_engine *engine);

/* Timings of the finished work since the engine was created or the last reset. */
typedef struct kite_engine_timings {
    double prefill_seconds;          /* the steps that read prompt tokens, alone or beside generating rows */
    int64_t prefill_tokens;          /* the prompt tokens they read */
    int64_t prefill_steps;
    int64_t prefill_step_generated;  /* the tokens they generated for requests that were already generating */
    double decode_seconds;           /* the steps of generating rows only */
    int64_t decode_tokens;
    int64_t decode_steps;
} kite_engine_timings;

kite_engine_timings kite_engine_get_timings(const kite_engine *engine);
void kite_engine_reset_timings(kite_engine *engine);

/* ---- chat ------------------------------------------------------------------------------------------ */

/* A checkpoint's chat format: its chat template (chat_template.jinja, or tokenizer_config.json's
 * chat_template), rendered exactly as transformers' apply_chat_template renders it, with the tokenizer, the
 * token that ends an assistant turn and generation_config.json's sampling defaults. */
typedef struct kite_chat kite_chat;

/* The chat format of a checkpoint or tokenizer directory alone (tokenizer files, no weights); with
 * template_path, that .jinja file replaces the directory's template (as llama.cpp's and vLLM's --chat-template).
 * No chat template at all is KITE_ERROR_UNSUPPORTED; a template kite cannot run is KITE_ERROR_INVALID_TEMPLATE
 * naming its file, line and construct. */
kite_status kite_chat_load(const char *dir, const char *template_path, kite_chat **out);
void kite_chat_free(kite_chat *chat);
/* The model's chat format (its template was parsed when it loaded); NULL when the checkpoint has none. */
const kite_chat *kite_model_chat(const kite_model *model);

/* A request's tool_choice (OpenAI's): whether the answer may, must, or must not call a tool. */
typedef enum kite_tool_choice {
    KITE_TOOL_CHOICE_AUTO = 0, /* "auto", or no tool_choice: the model decides */
    KITE_TOOL_CHOICE_NONE,     /* "none": the tools are shown but calls are not parsed */
    KITE_TOOL_CHOICE_REQUIRED, /* "required": the answer starts with a call to one of the tools */
    KITE_TOOL_CHOICE_NAMED,    /* {"type": "function", "function": {"name": N}}: the answer starts with a call to N */
} kite_tool_choice;

typedef struct kite_chat_prompt {
    char *text;               /* the rendered prompt, NUL-terminated; ends with `forced` unless it is inserted */
    size_t length;
    int32_t *ids;             /* text encoded with the tokenizer (special tokens recognised) */
    size_t n_ids;
    bool thinking;            /* the model may think: enable_thinking is not false (for a forced tool choice: and
                                 the template thinks, or the template opens <think> whatever it says) */
    bool starts_in_reasoning; /* the prompt leaves a <think> open: the answer starts as reasoning */
    bool has_tools;           /* tools are offered and tool_choice lets the model call them */
    kite_tool_choice tool_choice;
    /* REQUIRED and NAMED: the opening of the answer's first tool call, written by kite instead of the model:
     * '<tool_call>\n{"name": "' for REQUIRED, '<tool_call>\n{"name": "N", "arguments":' for NAMED. Without
     * thinking it ends `text` (and so `ids`): kite_chat_submit parses it as the answer's first bytes, its tokens
     * are the prompt's. With thinking it is the insertion below. NULL (forced_length 0) otherwise. */
    char *forced;
    size_t forced_length;
    /* With thinking, REQUIRED and NAMED: the engine's insertion (kite_request.insert_after / insert_ids) that
     * kite_chat_submit gives the request: after the model's first </think> (insert_after, its id), "\n\n" and
     * `forced`, tokenized as the template writes them. The answer is reasoning, then the call. n_insert_ids 0
     * (insert_ids NULL) otherwise. */
    int32_t insert_after;
    int32_t *insert_ids;
    size_t n_insert_ids;
    /* REQUIRED: the tools' names; NAMED: N alone. A parsed call naming anything else is malformed (chat_output.h,
     * T4). NULL (n_call_names 0) otherwise: any name is a call. */
    char **call_names;
    size_t n_call_names;
} kite_chat_prompt;

/* Renders a /v1/chat/completions request body (messages, tools, tool_choice, add_generation_prompt (default
 * true), chat_template_kwargs such as {"enable_thinking": false}) with the chat template. Messages are prepared
 * as vLLM prepares them: null content as "", text parts joined with "\n", a tool call's arguments string parsed
 * into its object. tool_choice "required" or a named function (needs tools; the name must be one of them) forces
 * the answer's first call (kite_chat_prompt.forced): with thinking (enable_thinking not false, and a template
 * whose prompt changes with it, or one that opens <think> itself) the turn renders as asked and the call's
 * opening is inserted after the model's </think> (kite_chat_prompt.insert_ids); otherwise the prompt ends with
 * the opening. A template that opens <think> with a tokenizer that has no single </think> token is
 * KITE_ERROR_UNSUPPORTED.
 * A malformed request, or an error the template raises, is KITE_ERROR_INVALID_INPUT naming the field or
 * quoting the template. */
kite_status kite_chat_render(const kite_chat *chat, const char *request_json, size_t length, kite_chat_prompt *out);
void kite_chat_prompt_free(kite_chat_prompt *prompt);

/* The ids that end an answer besides config.json's eos ids (the template's end-of-turn token, the eos ids of
 * generation_config.json): copies up to `capacity` and returns how many there are. */
int32_t kite_chat_stop_ids(const kite_chat *chat, int32_t *ids, int32_t capacity);
/* generation_config.json's sampling (Qwen3: temperature 0.6, top_p 0.95, top_k 20), for requests that set
 * none; greedy when the checkpoint has no generation_config.json or it does not sample. */
kite_sampling kite_chat_sampling_defaults(const kite_chat *chat);


/* What a chat answer produced in one step, parsed: text inside <think>...</think> is reasoning, <tool_call>
 * blocks are tool calls (hermes style, as vLLM's qwen3 reasoning parser and hermes tool parser read them), the
 * rest is content. The pointers are valid only during the callback. */
typedef struct kite_tool_call {
    const char *id;        /* "chatcmpl-tool-" and 32 hex digits */
    const char *name;
    const char *arguments; /* JSON text: json.dumps(arguments, ensure_ascii=False) */
} kite_tool_call;

typedef struct kite_chat_delta {
    const char *reasoning;
    size_t reasoning_length;
    const char *content;
    size_t content_length;
    const kite_tool_call *tool_calls; /* calls completed in this step */
    size_t n_tool_calls;
} kite_chat_delta;

typedef struct kite_chat_event {
    kite_request_id request;
    kite_chat_delta delta;
    const kite_token_event *token; /* the engine's event beneath it (token id, logprobs, raw text) */
    kite_finish_reason finish;     /* non-zero on the request's last event */
} kite_chat_event;

typedef void (*kite_chat_callback)(const kite_chat_event *event, void *user_data);

/* Queues a chat answer to a rendered prompt: `request` gives max_tokens, sampling, stop strings and logprobs
 * (its prompt, stop ids, insertion and callback are replaced: the prompt's ids and insertion, the chat's stop ids
 * and the parser). Events come from kite_engine_step like a plain request's. Tool calls are parsed when the
 * prompt has_tools; their ids are drawn from request->sampling.seed. A prompt's forced opening at its end is
 * parsed before the first token (it must open a tool call: KITE_ERROR_INVALID_ARGUMENT otherwise); one inserted
 * after the reasoning is parsed where it comes, the "\n\n" before it dropped. Only calls to its call_names
 * count. */
kite_status kite_chat_submit(kite_engine *engine, const kite_chat *chat, const kite_chat_prompt *prompt,
                             const kite_request *request, kite_chat_callback on_event, void *user_data,
                             kite_request_id *id);

/* ---- benchmarks ------------------------------------------------------------------------------------ */

/* kite bench's measurements (docs/BENCHMARKS.md), as llama-bench's: pp N rows prefill B prompts of N random
 * tokens, tg N rows decode N steps of B sequences after a context of `depth` tokens. What is timed is the engine's
 * own step path: every row runs as requests through kite_engine_step (its scheduling, its overlapped greedy decode,
 * its samplers). Before it is timed, every row is checked against the float32 CPU backend on the same weights
 * (the gate); a row that fails is reported, not timed. */

#define KITE_BENCH_MAX_BATCH 256 /* sequences of one row at most */

typedef struct kite_bench_params {
    const int32_t *prefill; /* pp rows: the prompt lengths N (default 256, 2048); none when n_prefill is 0 */
    size_t n_prefill;
    const int32_t *decode;  /* tg rows: the decode steps N (default 128); none when n_decode is 0 */
    size_t n_decode;
    const int32_t *batch;   /* B of the rows, 1 .. KITE_BENCH_MAX_BATCH (default 1): pp rows prefill B prompts,
                               at most 8,192 tokens per step (one prompt per step when N is larger); tg rows
                               decode B sequences together */
    size_t n_batch;
    const int32_t *depth;   /* tg rows: the context in the cache before the timed steps (default 256) */
    size_t n_depth;
    int32_t repetitions;    /* timed repetitions per row, after one warm-up; the median is reported (default 5) */
    uint64_t seed;          /* the random prompts and contexts (default 0) */
    kite_sampling sampling; /* tg rows: temperature 0 (the default) decodes greedily on the device; above 0 every
                               sequence is sampled by the engine's sampler with these filters, its seed
                               sampling.seed + the sequence's index */
    bool prefix_cache;      /* the rows' engine caches prefixes (kite_engine_params.prefix_cache; default true, as
                               an engine's): its random prompts never hit, so a row pays what registering the
                               full blocks costs and nothing is skipped */
} kite_bench_params;

kite_bench_params kite_bench_params_default(void); /* the arrays are static */

/* What a run measures on: for the report's header. The strings are the model's and live as long as it. */
typedef struct kite_bench_info {
    const char *backend_name;  /* "cpu", "cuda" */
    const char *device_name;   /* "NVIDIA H200", "cpu (16 threads)" */
    const char *decode_path;   /* the backend's account of its decode kernels with the settings in effect (CUDA);
                                  NULL where there is one path */
    const char *commit;        /* kite_build_commit() */
    bool gated;                /* rows are checked against the CPU backend (false on the CPU backend: the oracle) */
    bool greedy_overlapped;    /* the engine runs greedy decode ahead (KITE_ENGINE_OVERLAP, the backend) */
    bool sampled;              /* tg rows are sampled (sampling.temperature > 0) */
} kite_bench_info;

/* Validates params (NULL: the defaults) against the model, as kite_bench_run does, and fills out. */
kite_status kite_bench_describe(const kite_model *model, const kite_bench_params *params, kite_bench_info *out);

typedef struct kite_bench_row {
    char test[24];               /* "pp256", "tg128" */
    bool is_decode;              /* a tg row */
    int32_t n;                   /* N: prompt length (pp) or decode steps (tg) */
    int32_t batch;               /* B */
    int32_t depth;               /* tg rows: the context before the timed steps; 0 for pp rows */
    bool gate_passed;            /* also true when nothing was compared (kite_bench_info.gated false) */
    double gate_rel_l2;          /* the worst relative L2 distance of the compared logits to the CPU's */
    double gate_bf16_budget;     /* the worst distance bf16 storage alone gives the CPU's logits */
    int32_t gate_near_ties;      /* compared positions whose argmax differed within each other's top 5 */
    char gate_why[160];          /* why the gate failed ("" when it passed) */
    /* Timing, when the gate passed (else 0): */
    double tok_s;                /* B x N / wall time, the median repetition */
    double tok_s_min;
    double tok_s_max;
    double ms_per_step;          /* median: tg rows one decode step, pp rows the whole prefill */
    double hbm_floor_fraction;   /* CUDA tg rows: the time to read the weights and the KV cache once at 4.3 TB/s
                                    over the measured step time; 0 otherwise */
    bool overlapped;             /* tg rows: each step after the first ran ahead, enqueued before the previous
                                    step's ids were read */
    int64_t engine_steps;        /* kite_engine_step calls timed per repetition (counted by the engine) */
    int64_t engine_steps_ahead;  /* of which ran ahead (kite_engine_stats.steps_ahead) */
} kite_bench_row;

typedef void (*kite_bench_row_callback)(const kite_bench_row *row, void *user_data);

/* Runs every row: for each B the pp rows, then for each depth, each B, the tg rows; on_row gets each one as it is
 * done. Creates the model's engine for the run (the model must have none) and frees it. A row that fails its
 * gate is no error (row.gate_passed false); an error ends the run after the rows already reported. */
kite_status kite_bench_run(kite_model *model, const kite_bench_params *params, kite_bench_row_callback on_row,
                           void *user_data);

#ifdef __cplusplus
}
#endif

#endif

/* The single-stream decode path's state (decode_path.cu): buffers fixed for the life of the backend (the captured
 * graphs hold their addresses), the step buffer on the device and the captured graphs. */
#ifndef KITE_BACKEND_CUDA_DECODE_PATH_CUH
#define KITE_BACKEND_CUDA_DECODE_PATH_CUH

#include "backend/cuda/cuda_core.cuh"

/* The step buffer's layout on the device: */
enum { STEP_TOKEN = 0, STEP_POSITION = 1, STEP_SLOT = 2, STEP_CONTEXT = 3, STEP_TABLE = 4 };

/* The single-stream decode attention kernels, by the contexts they serve best (measured, docs/cuda.md): the
 * bulk-copy fed cluster kernel up to bulk_max_context, the split-K one beyond (and wherever the device cannot run
 * clusters). */
enum { DECODE_ATTENTION_BULK = 0, DECODE_ATTENTION_SPLIT = 1, N_DECODE_ATTENTION = 2 };

struct decode_state {
    int n_splits;             /* of the split-K attention: one wave of blocks (attention_splits(core, 1)) */
    int attention_bulk;       /* cluster size of the bulk-copy fed attention (attention_decode_bulk.cu), 0: none */
    int32_t bulk_max_context; /* contexts up to this take the bulk-fed attention */
    /* The lm_head's int8 screen (lm_head_screen.cu; cuda_lm_head_screen_bytes), NULL where it is off
     * (KITE_CUDA_LM_HEAD_SCREEN=0), does not fit the shape, or could not be allocated. */
    void *lm_head_screen;

    void *bytes; /* one allocation for the buffers below */
    float *x, *qkv, *q, *attention, *act, *logits;
    void *attention_ws, *argmax_ws;
    unsigned *counters;
    int32_t *token;                   /* the argmax of the last decode step */
    int32_t *step_device, *step_host; /* STEP_* then the block table */
    cudaEvent_t step_copied;
    /* After a step chained in place (its token the previous step's argmax on the device), the step's publish
     * kernel moves step_device on to the next position (cuda_publish_and_advance), and the next such step finds
     * there what the host would copy: forward_decode copies only when its values differ (a new block, another
     * sequence, a host token). A copy between two graph launches costs ~1.9 us per step. */
    bool step_advanced;             /* step_device holds step_next_position, token -1 and the table last copied */
    int32_t step_next_position;
    int32_t step_table_copied;      /* entries of that table (step_host holds them) */
    unsigned long long step_copies; /* step buffer copies made (cuda_backend_step_copies) */
    /* Captured decode steps, one per attention kernel (decode_attention_kernel picks one per step by context), with
     * the lm_head as the GEMV (logits kept) or screened ([1]: step_batch.ids_only, where lm_head_screen is set). */
    cudaGraphExec_t graph[2][N_DECODE_ATTENTION];
    /* The step writes its id into slot (position & 1) of this mapped host ring itself (cuda_publish_and_advance,
     * its last kernel), so a begun argmax of it records an event instead of a copy on the stream (tg128 at depth
     * 256 +1.3% against the copy). */
    int32_t *publish_host, *publish_device; /* 2 ints, mapped */
};

/* The buffers above for the core's shapes (n_splits set), zeroed; at creation. */
kite_status decode_alloc_buffers(const cuda_core *core, decode_state *d);
/* The step buffer for a table of n_blocks entries (kv_reserve, after decode_destroy_graphs). */
kite_status decode_reserve_step(decode_state *d, int32_t n_blocks);
/* One sequence, one token, logits wanted: its logits row (or, for ids_only, its argmax alone) into *kept. */
kite_status forward_decode(cuda_core *core, decode_state *d, const step_batch *batch, step_tokens tokens,
                           kept_rows *kept);
kite_status decode_destroy_graphs(decode_state *d);
void decode_free(decode_state *d);

#endif

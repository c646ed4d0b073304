/* The communicator the tensor-parallel ranks talk through: one handle per rank, its operations in a table.
 *
 * The forward (parallel/tp_cpu.c today, the CUDA path later) sees only this interface, so the transport can
 * change under it: comm_threads.c runs N ranks as N threads of one process sharing memory (the CPU
 * simulation); an NCCL communicator (ncclCommInitRank over an id from ncclGetUniqueId, one per GPU, one thread
 * or one process each) fills the same table.
 *
 * Every operation is collective: each rank of the group calls it, in the same order, with the same count. A
 * rank that fails outside a collective (out of memory, a device error) calls fail(), and then every rank's
 * current or next collective returns an error carrying that rank's message instead of waiting for it; a rank
 * that vanishes without a word is caught by the timeout: the first rank whose wait runs out fails the group in
 * its turn. Once failed, a group stays failed (as an aborted NCCL communicator does): every later collective
 * returns the error at once.
 */
#ifndef KITE_PARALLEL_COMM_H
#define KITE_PARALLEL_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "kite.h"

typedef struct tp_comm tp_comm;

/* One candidate of the distributed argmax: a rank's best logit and its index in the whole vocabulary. */
typedef struct tp_argmax_candidate {
    float value;
    int32_t index;
} tp_argmax_candidate;

typedef struct tp_comm_ops {
    /* This handle's rank in [0, size). */
    int32_t (*rank)(const tp_comm *self);
    /* The ranks in the group. */
    int32_t (*size)(const tp_comm *self);
    /* data[0 .. count) becomes the element-wise sum over the ranks, the same bits on every rank: each element is
     * rank 0's + rank 1's + ... in rank order, so a result never depends on timing. */
    kite_status (*all_reduce_sum)(tp_comm *self, float *data, size_t count);
    /* The winner over every rank's candidate, the same on every rank, by the single-rank argmax's rule (the CPU
     * backend's argmax_rows): the greater value, ties to the lower index; a NaN beats everything (the lowest
     * index of the NaNs), so a row with a NaN anywhere comes out NaN and the caller refuses it as the
     * single-rank argmax does. */
    kite_status (*argmax)(tp_comm *self, tp_argmax_candidate mine, tp_argmax_candidate *winner);
    /* Fails the group on behalf of this rank: status and message (this thread's kite_last_error() when message
     * is NULL) reach every rank's collectives. The first failure is the one reported. */
    void (*fail)(tp_comm *self, kite_status status, const char *message);
} tp_comm_ops;

struct tp_comm {
    const tp_comm_ops *ops;
};

/* The argmax rule itself, for transports that combine candidates (and for the test): whether a beats b. */
int tp_argmax_beats(tp_argmax_candidate a, tp_argmax_candidate b);

#endif

/* The communicator of N ranks that are N threads of one process (comm.h): the CPU simulation of tensor
 * parallelism, and the shape the one-thread-per-GPU NCCL driver takes.
 *
 * The ranks meet at a reusable barrier (a pthread mutex and condition variable); the last rank to arrive does
 * the collective's work for all of them while the others wait, so a result is computed once, in rank order,
 * and every rank reads the same bits. Each wait is bounded by the group's timeout.
 */
#ifndef KITE_PARALLEL_COMM_THREADS_H
#define KITE_PARALLEL_COMM_THREADS_H

#include <stdint.h>

#include "kite.h"
#include "parallel/comm.h"

typedef struct comm_threads_group comm_threads_group;

/* A group of n_ranks ranks (>= 1) whose collectives give up after timeout_ms milliseconds (>= 1) of waiting
 * for the others. */
kite_status comm_threads_create(int32_t n_ranks, int32_t timeout_ms, comm_threads_group **out);
void comm_threads_destroy(comm_threads_group *group);

/* Rank `rank`'s handle (NULL outside [0, n_ranks)); owned by the group. */
tp_comm *comm_threads_comm(comm_threads_group *group, int32_t rank);

/* One rank's work: it runs on its own thread with its handle and user_data[rank]. */
typedef kite_status (*comm_threads_rank_fn)(tp_comm *comm, void *user_data);

/* Runs fn on n_ranks threads, one per rank, and waits for all of them. A rank whose fn fails, fails the group
 * with its message (comm.h), so the others end too instead of waiting for it. Returns KITE_OK when every rank
 * succeeded; otherwise the group's first failure, its message naming the rank. comm_threads_rank_status then
 * says how each rank ended. After a failure the group stays failed. */
kite_status comm_threads_run(comm_threads_group *group, comm_threads_rank_fn fn, void *const *user_data);

/* How rank `rank` ended in the last comm_threads_run, and its message ("" when it succeeded). */
kite_status comm_threads_rank_status(const comm_threads_group *group, int32_t rank, const char **message);

#endif

/* N ranks as N threads of one process (comm_threads.h). */
#include "parallel/comm_threads.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/error.h"

#define COMM_MESSAGE_MAX 512

/* What a rank brings to the collective it is in. */
typedef enum comm_op { COMM_OP_ALL_REDUCE, COMM_OP_ARGMAX } comm_op;

typedef struct comm_threads_rank {
    tp_comm base; /* first: a comm_threads_rank * is a tp_comm * */
    comm_threads_group *group;
    int32_t rank;
    /* This rank's part of the current collective, read by the rank that completes it. */
    comm_op op;
    float *data;
    size_t count;
    tp_argmax_candidate candidate;
    /* How its last comm_threads_run ended. */
    kite_status status;
    char message[COMM_MESSAGE_MAX];
    /* comm_threads_run's thread and what it runs. */
    pthread_t thread;
    comm_threads_rank_fn fn;
    void *user_data;
} comm_threads_rank;

struct comm_threads_group {
    int32_t n_ranks;
    int32_t timeout_ms;
    comm_threads_rank *ranks; /* n_ranks */
    pthread_mutex_t mutex;
    pthread_cond_t arrived_all; /* the barrier's generation moved on, or the group failed */
    int32_t n_arrived;
    uint64_t generation;
    /* The first failure; once set, every collective returns it. */
    bool failed;
    kite_status fail_status;
    char fail_message[COMM_MESSAGE_MAX];
    /* The completed collective's results, read by every rank after the barrier and rewritten only when all of them
     * have arrived at the next one. */
    float *sum;
    size_t sum_capacity;
    tp_argmax_candidate winner;
};

static const tp_comm_ops comm_threads_ops;

/* Records the group's first failure and wakes every waiting rank. Called with the mutex held. */
static void group_fail_locked(comm_threads_group *g, kite_status status, const char *fmt, ...) KITE_PRINTF_LIKE(3, 4);
static void group_fail_locked(comm_threads_group *g, kite_status status, const char *fmt, ...) {
    if (g->failed) return;
    g->failed = true;
    g->fail_status = status;
    va_list args;
    va_start(args, fmt);
    vsnprintf(g->fail_message, sizeof g->fail_message, fmt, args);
    va_end(args);
    /* Broadcasting on a valid condition variable cannot fail (POSIX lists no error for it); the waiters' timeout
     * would catch it anyway. */
    (void)pthread_cond_broadcast(&g->arrived_all);
}

/* The group's failure as this thread's error. Called with the mutex held. */
static kite_status group_error_locked(const comm_threads_group *g) {
    return kite_fail(g->fail_status, "%s", g->fail_message);
}

/* The collective's work, done by the last rank to arrive while every other rank waits: each reads the others'
 * buffers, which stay untouched until the barrier opens. */
static void complete_collective_locked(comm_threads_group *g) {
    const comm_threads_rank *first = &g->ranks[0];
    for (int32_t r = 1; r < g->n_ranks; r++) {
        const comm_threads_rank *other = &g->ranks[r];
        if (other->op != first->op || (first->op == COMM_OP_ALL_REDUCE && other->count != first->count)) {
            group_fail_locked(g, KITE_ERROR_INVALID_ARGUMENT,
                              "tensor parallel: the ranks disagree on a collective: rank 0 calls %s of %zu floats, "
                              "rank %d %s of %zu",
                              first->op == COMM_OP_ARGMAX ? "argmax" : "all_reduce_sum", first->count, (int)r,
                              other->op == COMM_OP_ARGMAX ? "argmax" : "all_reduce_sum", other->count);
            return;
        }
    }
    if (first->op == COMM_OP_ARGMAX) {
        tp_argmax_candidate best = first->candidate;
        for (int32_t r = 1; r < g->n_ranks; r++)
            if (tp_argmax_beats(g->ranks[r].candidate, best)) best = g->ranks[r].candidate;
        g->winner = best;
        return;
    }
    const size_t count = first->count;
    if (count > g->sum_capacity) {
        float *grown = count <= SIZE_MAX / sizeof(float) ? realloc(g->sum, count * sizeof(float)) : NULL;
        if (!grown) {
            group_fail_locked(g, KITE_ERROR_OUT_OF_MEMORY,
                              "tensor parallel: cannot allocate the all-reduce buffer of %zu floats", count);
            return;
        }
        g->sum = grown;
        g->sum_capacity = count;
    }
    /* Rank order, element by element: the bits never depend on which rank arrived last. */
    memcpy(g->sum, first->data, count * sizeof(float));
    for (int32_t r = 1; r < g->n_ranks; r++) {
        const float *data = g->ranks[r].data;
        for (size_t i = 0; i < count; i++)
            g->sum[i] += data[i];
    }
}

/* The time timeout_ms from now on the monotonic clock (the condition variable's), or an error. */
static kite_status deadline_after(int32_t timeout_ms, struct timespec *out) {
    if (clock_gettime(CLOCK_MONOTONIC, out) != 0)
        return kite_fail(KITE_ERROR_BACKEND, "tensor parallel: clock_gettime: %s", strerror(errno));
    out->tv_sec += timeout_ms / 1000;
    out->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (out->tv_nsec >= 1000000000L) {
        out->tv_sec++;
        out->tv_nsec -= 1000000000L;
    }
    return KITE_OK;
}

/* Rank r arrives at the barrier with its part already in its slot; returns when every rank has arrived and the
 * last has completed the collective, or with the group's failure. */
static kite_status group_meet(comm_threads_rank *me) {
    comm_threads_group *g = me->group;
    struct timespec deadline;
    KITE_TRY(deadline_after(g->timeout_ms, &deadline));
    int rc = pthread_mutex_lock(&g->mutex);
    if (rc != 0) return kite_fail(KITE_ERROR_BACKEND, "tensor parallel: pthread_mutex_lock: %s", strerror(rc));
    if (!g->failed && ++g->n_arrived == g->n_ranks) {
        complete_collective_locked(g);
        g->n_arrived = 0;
        g->generation++;
        (void)pthread_cond_broadcast(&g->arrived_all); /* cannot fail: see group_fail_locked */
    } else if (!g->failed) {
        const uint64_t generation = g->generation;
        while (g->generation == generation && !g->failed) {
            rc = pthread_cond_timedwait(&g->arrived_all, &g->mutex, &deadline);
            if (rc == ETIMEDOUT && g->generation == generation && !g->failed)
                group_fail_locked(g, KITE_ERROR_BACKEND,
                                  "tensor parallel: rank %d waited %d ms in a collective for the other ranks (%d of "
                                  "%d arrived): a rank stopped without reporting a failure",
                                  (int)me->rank, (int)g->timeout_ms, (int)g->n_arrived, (int)g->n_ranks);
            else if (rc != 0 && rc != ETIMEDOUT)
                group_fail_locked(g, KITE_ERROR_BACKEND, "tensor parallel: rank %d: pthread_cond_timedwait: %s",
                                  (int)me->rank, strerror(rc));
        }
    }
    const kite_status status = g->failed ? group_error_locked(g) : KITE_OK;
    rc = pthread_mutex_unlock(&g->mutex);
    if (rc != 0 && status == KITE_OK)
        return kite_fail(KITE_ERROR_BACKEND, "tensor parallel: pthread_mutex_unlock: %s", strerror(rc));
    return status;
}

static int32_t threads_rank(const tp_comm *self) { return ((const comm_threads_rank *)self)->rank; }

static int32_t threads_size(const tp_comm *self) { return ((const comm_threads_rank *)self)->group->n_ranks; }

static kite_status threads_all_reduce_sum(tp_comm *self, float *data, size_t count) {
    comm_threads_rank *me = (comm_threads_rank *)self;
    if (!data && count > 0) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "tensor parallel: all_reduce_sum of NULL");
    me->op = COMM_OP_ALL_REDUCE;
    me->data = data;
    me->count = count;
    KITE_TRY(group_meet(me));
    /* Every rank reads the sum before the next collective can complete and rewrite it. */
    if (count > 0) memcpy(data, me->group->sum, count * sizeof(float));
    return KITE_OK;
}

static kite_status threads_argmax(tp_comm *self, tp_argmax_candidate mine, tp_argmax_candidate *winner) {
    comm_threads_rank *me = (comm_threads_rank *)self;
    if (!winner) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "tensor parallel: argmax: winner is NULL");
    me->op = COMM_OP_ARGMAX;
    me->count = 0;
    me->candidate = mine;
    KITE_TRY(group_meet(me));
    *winner = me->group->winner;
    return KITE_OK;
}

static void threads_fail(tp_comm *self, kite_status status, const char *message) {
    comm_threads_rank *me = (comm_threads_rank *)self;
    comm_threads_group *g = me->group;
    const int rc = pthread_mutex_lock(&g->mutex);
    /* A mutex that cannot be taken leaves the others to their timeout: the failure still ends the run. */
    if (rc != 0) return;
    group_fail_locked(g, status == KITE_OK ? KITE_ERROR_BACKEND : status, "tensor parallel: rank %d failed: %s",
                      (int)me->rank, message ? message : kite_last_error());
    (void)pthread_mutex_unlock(&g->mutex);
}

static const tp_comm_ops comm_threads_ops = {
    .rank = threads_rank,
    .size = threads_size,
    .all_reduce_sum = threads_all_reduce_sum,
    .argmax = threads_argmax,
    .fail = threads_fail,
};

kite_status comm_threads_create(int32_t n_ranks, int32_t timeout_ms, comm_threads_group **out) {
    if (!out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "comm_threads_create: out is NULL");
    *out = NULL;
    if (n_ranks < 1 || timeout_ms < 1)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "comm_threads_create: %d ranks, a timeout of %d ms (both >= 1)",
                         (int)n_ranks, (int)timeout_ms);
    comm_threads_group *g = calloc(1, sizeof *g);
    comm_threads_rank *ranks = calloc((size_t)n_ranks, sizeof *ranks);
    if (!g || !ranks) {
        free(g);
        free(ranks);
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "tensor parallel: cannot allocate a group of %d ranks",
                         (int)n_ranks);
    }
    g->n_ranks = n_ranks;
    g->timeout_ms = timeout_ms;
    g->ranks = ranks;
    for (int32_t r = 0; r < n_ranks; r++)
        ranks[r] = (comm_threads_rank){.base = {&comm_threads_ops}, .group = g, .rank = r};
    pthread_condattr_t attr;
    int rc = pthread_condattr_init(&attr);
    if (rc == 0) {
        /* The monotonic clock: a wall-clock jump must not end or stretch a wait. */
        rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        if (rc == 0) rc = pthread_cond_init(&g->arrived_all, &attr);
        const int destroyed = pthread_condattr_destroy(&attr);
        if (rc == 0 && destroyed != 0) {
            (void)pthread_cond_destroy(&g->arrived_all);
            rc = destroyed;
        }
    }
    if (rc == 0) {
        rc = pthread_mutex_init(&g->mutex, NULL);
        if (rc != 0) (void)pthread_cond_destroy(&g->arrived_all);
    }
    if (rc != 0) {
        free(ranks);
        free(g);
        return kite_fail(KITE_ERROR_BACKEND, "tensor parallel: cannot create the barrier: %s", strerror(rc));
    }
    *out = g;
    return KITE_OK;
}

void comm_threads_destroy(comm_threads_group *group) {
    if (!group) return;
    /* Destroying an unlocked mutex or an unwaited condition variable cannot fail; comm_threads_run has joined
     * every rank's thread before this can be called. */
    (void)pthread_mutex_destroy(&group->mutex);
    (void)pthread_cond_destroy(&group->arrived_all);
    free(group->sum);
    free(group->ranks);
    free(group);
}

tp_comm *comm_threads_comm(comm_threads_group *group, int32_t rank) {
    if (!group || rank < 0 || rank >= group->n_ranks) return NULL;
    return &group->ranks[rank].base;
}

static void *rank_thread(void *arg) {
    comm_threads_rank *me = arg;
    kite_error_clear();
    me->status = me->fn(&me->base, me->user_data);
    if (me->status != KITE_OK) {
        /* The message is this thread's: keep it for the caller, and hand it to the other ranks. */
        snprintf(me->message, sizeof me->message, "%s", kite_last_error());
        threads_fail(&me->base, me->status, me->message);
    }
    return NULL;
}

kite_status comm_threads_run(comm_threads_group *group, comm_threads_rank_fn fn, void *const *user_data) {
    if (!group || !fn) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "comm_threads_run: group or fn is NULL");
    int32_t n_started = 0;
    kite_status start_status = KITE_OK;
    for (int32_t r = 0; r < group->n_ranks; r++) {
        comm_threads_rank *rank = &group->ranks[r];
        rank->fn = fn;
        rank->user_data = user_data ? user_data[r] : NULL;
        rank->status = KITE_OK;
        rank->message[0] = '\0';
    }
    for (int32_t r = 0; r < group->n_ranks; r++) {
        const int rc = pthread_create(&group->ranks[r].thread, NULL, rank_thread, &group->ranks[r]);
        if (rc != 0) {
            /* The ranks already started must not wait for one that never will. */
            start_status = kite_fail(KITE_ERROR_BACKEND, "tensor parallel: cannot start rank %d's thread: %s", (int)r,
                                     strerror(rc));
            char message[COMM_MESSAGE_MAX];
            snprintf(message, sizeof message, "%s", kite_last_error());
            for (int32_t later = r; later < group->n_ranks; later++) {
                group->ranks[later].status = start_status;
                snprintf(group->ranks[later].message, sizeof group->ranks[later].message, "%s", message);
            }
            threads_fail(&group->ranks[r].base, start_status, message);
            break;
        }
        n_started++;
    }
    kite_status join_status = KITE_OK;
    for (int32_t r = 0; r < n_started; r++) {
        const int rc = pthread_join(group->ranks[r].thread, NULL);
        if (rc != 0 && join_status == KITE_OK)
            join_status = kite_fail(KITE_ERROR_BACKEND, "tensor parallel: cannot join rank %d's thread: %s", (int)r,
                                    strerror(rc));
    }
    /* Every rank's thread has ended: the group's state is this thread's to read. */
    if (group->failed) return kite_fail(group->fail_status, "%s", group->fail_message);
    if (start_status != KITE_OK) return kite_fail(start_status, "tensor parallel: a rank's thread did not start");
    return join_status;
}

kite_status comm_threads_rank_status(const comm_threads_group *group, int32_t rank, const char **message) {
    if (!group || rank < 0 || rank >= group->n_ranks) {
        if (message) *message = "no such rank";
        return KITE_ERROR_INVALID_ARGUMENT;
    }
    if (message) *message = group->ranks[rank].message;
    return group->ranks[rank].status;
}

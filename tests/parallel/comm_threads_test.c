/* The threads communicator (src/parallel/comm_threads.h): sums in rank order, the argmax's tie rule, the barrier
 * reused many times, and failures that end every rank instead of leaving one waiting. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "parallel/comm_threads.h"
#include "test_util.h"
#include "util/error.h"

#define MAX_RANKS 4
#define ROUNDS 200
#define MAX_COUNT 97

/* Rank r's value at element i of round k: spread over magnitudes, so the order of the additions shows. */
static float value_at(int32_t rank, int32_t round, size_t i) {
    const uint32_t h = (uint32_t)(rank * 7919 + round * 104729) ^ (uint32_t)(i * 2654435761u);
    const float magnitude = (float)(1u << (h % 24));
    return (h & 1u ? -1.0f : 1.0f) * magnitude * (1.0f + (float)(h % 1000) / 1000.0f);
}

typedef struct sum_job {
    int32_t n_ranks;
    int32_t mismatches;
} sum_job;

static kite_status sum_rank(tp_comm *comm, void *user) {
    sum_job *job = user;
    const int32_t me = comm->ops->rank(comm);
    float data[MAX_COUNT];
    for (int32_t round = 0; round < ROUNDS; round++) {
        const size_t count = 1 + (size_t)(round * 13) % MAX_COUNT; /* the buffer grows and shrinks */
        for (size_t i = 0; i < count; i++)
            data[i] = value_at(me, round, i);
        KITE_TRY(comm->ops->all_reduce_sum(comm, data, count));
        for (size_t i = 0; i < count; i++) {
            float want = value_at(0, round, i);
            for (int32_t r = 1; r < job->n_ranks; r++)
                want += value_at(r, round, i);
            if (memcmp(&want, &data[i], sizeof want) != 0) job->mismatches++;
        }
    }
    return KITE_OK;
}

static void test_all_reduce_sums_in_rank_order(void) {
    for (int32_t n = 1; n <= MAX_RANKS; n++) {
        comm_threads_group *group;
        CHECK(comm_threads_create(n, 20000, &group) == KITE_OK);
        sum_job jobs[MAX_RANKS];
        void *users[MAX_RANKS];
        for (int32_t r = 0; r < n; r++) {
            jobs[r] = (sum_job){n, 0};
            users[r] = &jobs[r];
        }
        CHECK_MSG(comm_threads_run(group, sum_rank, users) == KITE_OK, "N=%d: %s", (int)n, kite_last_error());
        for (int32_t r = 0; r < n; r++)
            CHECK_MSG(jobs[r].mismatches == 0, "N=%d rank %d: %d sums differ from rank order", (int)n, (int)r,
                      (int)jobs[r].mismatches);
        comm_threads_destroy(group);
    }
}

static kite_status cancel_rank(tp_comm *comm, void *user) {
    float *result = user;
    /* 1e8 + -1e8 + 1 is 1 in rank order; any other order loses the 1 to rounding. */
    const float values[3] = {1e8f, -1e8f, 1.0f};
    *result = values[comm->ops->rank(comm)];
    return comm->ops->all_reduce_sum(comm, result, 1);
}

static void test_all_reduce_order_is_fixed(void) {
    comm_threads_group *group;
    CHECK(comm_threads_create(3, 20000, &group) == KITE_OK);
    float results[3];
    void *users[3] = {&results[0], &results[1], &results[2]};
    CHECK(comm_threads_run(group, cancel_rank, users) == KITE_OK);
    for (int r = 0; r < 3; r++)
        CHECK_MSG(results[r] == 1.0f, "rank %d: %g", r, (double)results[r]);
    comm_threads_destroy(group);
}

typedef struct argmax_job {
    tp_argmax_candidate mine;
    tp_argmax_candidate winner;
} argmax_job;

static kite_status argmax_rank(tp_comm *comm, void *user) {
    argmax_job *job = user;
    return comm->ops->argmax(comm, job->mine, &job->winner);
}

static void run_argmax(const tp_argmax_candidate *candidates, int32_t n, tp_argmax_candidate expected) {
    comm_threads_group *group;
    CHECK(comm_threads_create(n, 20000, &group) == KITE_OK);
    argmax_job jobs[MAX_RANKS];
    void *users[MAX_RANKS];
    for (int32_t r = 0; r < n; r++) {
        jobs[r].mine = candidates[r];
        users[r] = &jobs[r];
    }
    CHECK_MSG(comm_threads_run(group, argmax_rank, users) == KITE_OK, "%s", kite_last_error());
    for (int32_t r = 0; r < n; r++) {
        const int same = isnan(expected.value) ? isnan(jobs[r].winner.value) : jobs[r].winner.value == expected.value;
        CHECK_MSG(same && jobs[r].winner.index == expected.index, "rank %d: winner (%g, %d), expected (%g, %d)", (int)r,
                  (double)jobs[r].winner.value, (int)jobs[r].winner.index, (double)expected.value, (int)expected.index);
    }
    comm_threads_destroy(group);
}

static void test_argmax_ties_go_to_the_lowest_index(void) {
    /* Equal values: the lowest index wins wherever its rank is, as the CPU backend's strictly-greater scan. */
    const tp_argmax_candidate tie[3] = {{2.0f, 10}, {2.0f, 5}, {1.0f, 0}};
    run_argmax(tie, 3, (tp_argmax_candidate){2.0f, 5});
    const tp_argmax_candidate plain[4] = {{-1.0f, 1}, {3.5f, 40}, {3.25f, 20}, {-INFINITY, 60}};
    run_argmax(plain, 4, (tp_argmax_candidate){3.5f, 40});
    /* A NaN anywhere wins (then the caller refuses the row), the lowest index of the NaNs. */
    const tp_argmax_candidate nan[3] = {{5.0f, 1}, {NAN, 30}, {NAN, 12}};
    run_argmax(nan, 3, (tp_argmax_candidate){NAN, 12});
    CHECK(tp_argmax_beats((tp_argmax_candidate){1.0f, 3}, (tp_argmax_candidate){1.0f, 4}));
    CHECK(!tp_argmax_beats((tp_argmax_candidate){1.0f, 4}, (tp_argmax_candidate){1.0f, 3}));
    CHECK(tp_argmax_beats((tp_argmax_candidate){INFINITY, 9}, (tp_argmax_candidate){1.0f, 0}));
}

/* Rank 1 fails before its first collective; the others wait in an all-reduce for it. */
static kite_status failing_rank(tp_comm *comm, void *user) {
    (void)user;
    if (comm->ops->rank(comm) == 1) {
        struct timespec pause = {0, 50 * 1000 * 1000}; /* the others are waiting by then */
        nanosleep(&pause, NULL);
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "test: rank 1 ran out of memory");
    }
    float x = 1.0f;
    return comm->ops->all_reduce_sum(comm, &x, 1);
}

static void test_a_failure_ends_every_rank(void) {
    comm_threads_group *group;
    CHECK(comm_threads_create(3, 20000, &group) == KITE_OK);
    const double start = test_seconds_now();
    const kite_status status = comm_threads_run(group, failing_rank, NULL);
    const double seconds = test_seconds_now() - start;
    CHECK(status == KITE_ERROR_OUT_OF_MEMORY);
    CHECK_MSG(strstr(kite_last_error(), "rank 1 failed: test: rank 1 ran out of memory") != NULL, "%s",
              kite_last_error());
    /* Well inside the 20 s timeout: the failure woke the waiting ranks. */
    CHECK_MSG(seconds < 5.0, "%.2f s", seconds);
    for (int32_t r = 0; r < 3; r++) {
        const char *message;
        CHECK_MSG(comm_threads_rank_status(group, r, &message) != KITE_OK, "rank %d ended well", (int)r);
        CHECK_MSG(strstr(message, "rank 1 ran out of memory") != NULL, "rank %d: %s", (int)r, message);
    }
    /* A failed group stays failed: the next collective returns at once. */
    const double again = test_seconds_now();
    CHECK(comm_threads_run(group, cancel_rank, (void *[3]){&(float){0}, &(float){0}, &(float){0}}) ==
          KITE_ERROR_OUT_OF_MEMORY);
    CHECK(test_seconds_now() - again < 5.0);
    comm_threads_destroy(group);
}

/* Rank 1 returns without taking part: nothing reports it, so only the timeout ends rank 0's wait. */
static kite_status silent_rank(tp_comm *comm, void *user) {
    (void)user;
    if (comm->ops->rank(comm) == 1) return KITE_OK;
    float x = 1.0f;
    return comm->ops->all_reduce_sum(comm, &x, 1);
}

static void test_a_silent_rank_times_out(void) {
    comm_threads_group *group;
    CHECK(comm_threads_create(2, 300, &group) == KITE_OK);
    const double start = test_seconds_now();
    const kite_status status = comm_threads_run(group, silent_rank, NULL);
    const double seconds = test_seconds_now() - start;
    CHECK(status == KITE_ERROR_BACKEND);
    CHECK_MSG(strstr(kite_last_error(), "rank 0 waited 300 ms") != NULL, "%s", kite_last_error());
    CHECK_MSG(seconds >= 0.29 && seconds < 10.0, "%.2f s", seconds);
    const char *message;
    CHECK(comm_threads_rank_status(group, 0, &message) == KITE_ERROR_BACKEND);
    CHECK(comm_threads_rank_status(group, 1, &message) == KITE_OK);
    comm_threads_destroy(group);
}

/* Rank 0 all-reduces while rank 1 takes an argmax: a bug in the caller, reported, not a hang or a wrong sum. */
static kite_status disagreeing_rank(tp_comm *comm, void *user) {
    (void)user;
    float x = 1.0f;
    tp_argmax_candidate winner;
    if (comm->ops->rank(comm) == 0) return comm->ops->all_reduce_sum(comm, &x, 1);
    return comm->ops->argmax(comm, (tp_argmax_candidate){1.0f, 0}, &winner);
}

static void test_disagreeing_collectives_fail(void) {
    comm_threads_group *group;
    CHECK(comm_threads_create(2, 20000, &group) == KITE_OK);
    CHECK(comm_threads_run(group, disagreeing_rank, NULL) == KITE_ERROR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(kite_last_error(), "disagree") != NULL, "%s", kite_last_error());
    comm_threads_destroy(group);
}

static void test_bad_arguments(void) {
    comm_threads_group *group = NULL;
    CHECK(comm_threads_create(0, 100, &group) == KITE_ERROR_INVALID_ARGUMENT && group == NULL);
    CHECK(comm_threads_create(2, 0, &group) == KITE_ERROR_INVALID_ARGUMENT && group == NULL);
    CHECK(comm_threads_create(2, 100, &group) == KITE_OK);
    CHECK(comm_threads_comm(group, 2) == NULL && comm_threads_comm(group, -1) == NULL);
    CHECK(comm_threads_comm(group, 1)->ops->rank(comm_threads_comm(group, 1)) == 1);
    comm_threads_destroy(group);
}

int main(void) {
    TEST_RUN(test_all_reduce_sums_in_rank_order);
    TEST_RUN(test_all_reduce_order_is_fixed);
    TEST_RUN(test_argmax_ties_go_to_the_lowest_index);
    TEST_RUN(test_a_failure_ends_every_rank);
    TEST_RUN(test_a_silent_rank_times_out);
    TEST_RUN(test_disagreeing_collectives_fail);
    TEST_RUN(test_bad_arguments);
    return test_finish();
}

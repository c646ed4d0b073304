/* A minimal test harness shared by kite's C tests.
 *
 * Each test executable runs its cases with TEST_RUN(fn), checks with CHECK / CHECK_MSG, and ends with
 * `return test_finish();`, which prints "N passed, N failed" and exits non-zero on any failure.
 * A test that cannot run on this machine (no GPU) calls test_skip("why"), which prints the reason
 * and exits 77 (ctest's SKIP_RETURN_CODE).
 * Each PASS or FAIL line gives the case's wall seconds, so a log shows where an executable's time goes.
 * KITE_TEST_ONLY=case[,case...] runs only the named cases (the function names TEST_RUN prints), e.g. one GPU
 * case on the lent machine; the others print "SKIP"; a filter that matches no case fails the executable.
 */
#ifndef KITE_TEST_UTIL_H
#define KITE_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int test_cases_passed __attribute__((unused));
static int test_cases_failed __attribute__((unused));
static int test_current_failures __attribute__((unused));
static int test_checks_failed __attribute__((unused));          /* every failed check, in a case or not */
static int test_checks_failed_in_cases __attribute__((unused)); /* those counted by TEST_RUN */

/* Seconds on the monotonic clock (0 where it cannot be read: the printed time is a diagnostic, not a check). */
static inline double test_seconds_now(void) {
    struct timespec t;
    if (clock_gettime(CLOCK_MONOTONIC, &t) != 0) return 0.0;
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Whether KITE_TEST_ONLY (unset or empty: every case) names this case. */
static inline int test_selected(const char *name) {
    const char *only = getenv("KITE_TEST_ONLY");
    if (only == NULL || *only == '\0') return 1;
    const size_t n = strlen(name);
    for (const char *p = only;;) {
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return 1;
        if (comma == NULL) return 0;
        p = comma + 1;
    }
}

#define CHECK(cond)                                                                                      \
    do {                                                                                                 \
        if (!(cond)) {                                                                                   \
            fprintf(stderr, "  CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, #cond);                \
            test_current_failures++;                                                                     \
            test_checks_failed++;                                                                        \
        }                                                                                                \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                             \
    do {                                                                                                 \
        if (!(cond)) {                                                                                   \
            fprintf(stderr, "  CHECK failed at %s:%d: %s: ", __FILE__, __LINE__, #cond);                \
            fprintf(stderr, __VA_ARGS__);                                                                \
            fputc('\n', stderr);                                                                         \
            test_current_failures++;                                                                     \
            test_checks_failed++;                                                                        \
        }                                                                                                \
    } while (0)

#define TEST_RUN(fn)                                                                                     \
    do {                                                                                                 \
        if (!test_selected(#fn)) {                                                                       \
            printf("SKIP %s (KITE_TEST_ONLY)\n", #fn);                                                   \
            break;                                                                                       \
        }                                                                                                \
        test_current_failures = 0;                                                                       \
        const double test_case_start = test_seconds_now();                                               \
        fn();                                                                                            \
        const double test_case_seconds = test_seconds_now() - test_case_start;                           \
        test_checks_failed_in_cases += test_current_failures;                                            \
        if (test_current_failures == 0) {                                                                \
            test_cases_passed++;                                                                         \
            printf("PASS %s (%.2f s)\n", #fn, test_case_seconds);                                        \
        } else {                                                                                         \
            test_cases_failed++;                                                                         \
            printf("FAIL %s (%d checks, %.2f s)\n", #fn, test_current_failures, test_case_seconds);      \
        }                                                                                                \
        fflush(stdout);                                                                                  \
    } while (0)

static inline int test_finish(void) {
    printf("%d passed, %d failed\n", test_cases_passed, test_cases_failed);
    /* A check outside any case (in main or a setup step) fails the executable too. */
    if (test_checks_failed > test_checks_failed_in_cases) {
        printf("%d checks failed outside a test case\n", test_checks_failed - test_checks_failed_in_cases);
        return 1;
    }
    if (test_cases_passed + test_cases_failed == 0 && getenv("KITE_TEST_ONLY") != NULL) {
        printf("KITE_TEST_ONLY=%s matched no case\n", getenv("KITE_TEST_ONLY"));
        return 1;
    }
    return test_cases_failed == 0 ? 0 : 1;
}

static inline void test_skip(const char *why) {
    printf("SKIPPED: %s\n", why);
    fflush(stdout);
    exit(77);
}

/* Reads a whole file into a NUL-terminated malloc'd buffer; NULL when unreadable. */
static inline char *test_read_file(const char *path, size_t *length) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return NULL; }
    long size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) { fclose(f); return NULL; }
    char *buffer = malloc((size_t)size + 1);
    if (!buffer) { fclose(f); return NULL; }
    size_t got = fread(buffer, 1, (size_t)size, f);
    fclose(f);
    if (got != (size_t)size) { free(buffer); return NULL; }
    buffer[size] = '\0';
    if (length) *length = (size_t)size;
    return buffer;
}

#endif

/* Pieces shared by the timing harnesses that link kite (cuda_forward_bench.c, gemv_bench.c): a kite call that
 * fails prints itself and ends the process, and the median of a run's samples. */
#ifndef KITE_BENCH_BENCH_UTIL_H
#define KITE_BENCH_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include "kite.h"

#define TRY(expr)                                                                                        \
    do {                                                                                                 \
        kite_status try_status_ = (expr);                                                                \
        if (try_status_ != KITE_OK) {                                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, kite_last_error());             \
            exit(1);                                                                                     \
        }                                                                                                \
    } while (0)

static inline int bench_cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts v in place. */
static inline double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif

/* Comparing a logits row against a reference row: the measures the backend tests share (DESIGN.md's numerics:
 * relative L2, and the near-tie rule on the argmaxes). */
#ifndef KITE_TESTS_LOGITS_COMPARE_H
#define KITE_TESTS_LOGITS_COMPARE_H

#include <math.h>
#include <stddef.h>

/* ||a - ref|| / ||ref||; infinite when a holds a non-finite value, so such a row can never pass a bound. */
static inline double rel_l2(const float *a, const float *ref, size_t n) {
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        e += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        r += (double)ref[i] * ref[i];
    }
    return sqrt(e / r);
}

static inline int argmax_of(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* Whether v[id] is among the five largest of v: the near-tie rule's test. */
static inline int in_top5(const float *v, int n, int id) {
    int above = 0;
    for (int i = 0; i < n; i++)
        if (v[i] > v[id]) above++;
    return above < 5;
}

#endif

/* The statistics of the quality tools (fp8_quality.c: fp8 weights against bf16 on the CPU; fp8_kv_quality.c: the
 * fp8 KV cache against bf16 on the CUDA backend): per teacher-forced position the logits' relative L2 distance, KL
 * of the two softmaxes and whether the argmaxes agree, gathered and summarised as one JSON line's fields (mean,
 * p50, p99, max; top-1 agreement). */
#ifndef KITE_BENCH_QUALITY_STATS_H
#define KITE_BENCH_QUALITY_STATS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static inline int32_t quality_argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static inline double quality_log_sum_exp(const float *x, int32_t n, double max) {
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += exp((double)x[i] - max);
    return max + log(sum);
}

/* KL(p || q) of the softmaxes of logits p and q. */
static inline double quality_kl_divergence(const float *p, const float *q, int32_t n) {
    const double lp = quality_log_sum_exp(p, n, p[quality_argmax(p, n)]);
    const double lq = quality_log_sum_exp(q, n, q[quality_argmax(q, n)]);
    double kl = 0;
    for (int32_t i = 0; i < n; i++) {
        const double log_p = (double)p[i] - lp, log_q = (double)q[i] - lq;
        kl += exp(log_p) * (log_p - log_q);
    }
    return kl;
}

static inline int quality_compare_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of sorted[n] (nearest rank). */
static inline double quality_quantile(const double *sorted, int32_t n, double q) {
    int32_t i = (int32_t)ceil(q * n) - 1;
    return sorted[i < 0 ? 0 : i >= n ? n - 1 : i];
}

/* Per-position figures of n positions (rel_l2 and kl hold n each). */
typedef struct quality_stats {
    double *rel_l2, *kl;
    int32_t n, capacity, agree;
} quality_stats;

/* 0 on success, -1 when out of memory. */
static inline int quality_stats_init(quality_stats *s, int32_t capacity) {
    s->rel_l2 = malloc((size_t)capacity * sizeof(double));
    s->kl = malloc((size_t)capacity * sizeof(double));
    s->n = s->agree = 0;
    s->capacity = capacity;
    return s->rel_l2 && s->kl ? 0 : -1;
}

static inline void quality_stats_free(quality_stats *s) {
    free(s->rel_l2);
    free(s->kl);
}

/* One position: the reference logits p against q (vocab values each); beyond capacity it is not counted. */
static inline void quality_stats_add(quality_stats *s, const float *p, const float *q, int32_t vocab) {
    if (s->n >= s->capacity) return;
    double diff = 0, norm = 0;
    for (int32_t i = 0; i < vocab; i++) {
        diff += ((double)q[i] - p[i]) * ((double)q[i] - p[i]);
        norm += (double)p[i] * p[i];
    }
    s->rel_l2[s->n] = sqrt(diff / norm);
    s->kl[s->n] = quality_kl_divergence(p, q, vocab);
    s->agree += quality_argmax(p, vocab) == quality_argmax(q, vocab);
    s->n++;
}

/* The summary as JSON fields (no braces; sorts the figures in place): "rel_l2_mean": ..., "kl_max": .... */
static inline void quality_stats_print(quality_stats *s, FILE *out) {
    const int32_t n = s->n;
    double rel_sum = 0, kl_sum = 0;
    for (int32_t i = 0; i < n; i++) {
        rel_sum += s->rel_l2[i];
        kl_sum += s->kl[i];
    }
    qsort(s->rel_l2, (size_t)n, sizeof(double), quality_compare_double);
    qsort(s->kl, (size_t)n, sizeof(double), quality_compare_double);
    fprintf(out,
            "\"rel_l2_mean\": %.5f, \"rel_l2_p50\": %.5f, \"rel_l2_p99\": %.5f, \"rel_l2_max\": %.5f, "
            "\"top1_agreement\": %.4f, \"kl_mean\": %.3e, \"kl_p50\": %.3e, \"kl_p99\": %.3e, \"kl_max\": %.3e",
            rel_sum / n, quality_quantile(s->rel_l2, n, 0.5), quality_quantile(s->rel_l2, n, 0.99), s->rel_l2[n - 1],
            (double)s->agree / n, kl_sum / n, quality_quantile(s->kl, n, 0.5), quality_quantile(s->kl, n, 0.99),
            s->kl[n - 1]);
}

#endif

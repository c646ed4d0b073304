/* Every CUDA kernel of src/backend/cuda against a CPU reference written here (double precision), on
 * random inputs of several shapes, including shapes that do not divide the kernels' tiles. Outputs are
 * poisoned (NaN) before each launch and followed by guard bytes that must stay untouched. */
#include "cuda_test_util.h"
#include "quant/fp8_kv.h"

/* bf16 outputs land within about 2^-9 relative per element: NMSE well under 1e-5; products over
 * bf16 inputs with fp32 accumulation: under 1e-6 for fp32 outputs. */
#define NMSE_BF16_OUT 2e-5
#define NMSE_F32_OUT 1e-8
#define NMSE_ATTENTION 1e-4 /* P rounded to bf16 before P.V */

/* With fallback ids: a negative id takes fallback[t] (overlapped decode), a valid one its own. */
static void test_embed(void) {
    const int vocab = 1000, hidden = 1032, n = 7;
    uint16_t *table = xmalloc((size_t)vocab * hidden * 2);
    random_bf16(table, NULL, (size_t)vocab * hidden, 1.0f);
    int32_t ids[7] = {0, 999, 5, 5, 123, 998, 1}, chained[7] = {-1, 999, -1, 5, -1, 998, -1};
    int32_t fallback[7] = {0, 7, 5, 8, 123, 9, 1};
    void *d_table = device_buffer((size_t)vocab * hidden * 2, table);
    float *x = xmalloc((size_t)n * hidden * 4);
    for (int with_fallback = 0; with_fallback < 2; with_fallback++) {
        void *d_ids = device_buffer(sizeof ids, with_fallback ? chained : ids);
        void *d_fallback = device_buffer(sizeof fallback, fallback);
        float *d_x = device_buffer((size_t)n * hidden * 4, NULL);
        DEVICE_CHECK(cuda_embed(d_table, d_ids, with_fallback ? d_fallback : NULL, d_x, n, hidden, NULL, 0));
        DEVICE_CHECK(kite_cuda_copy_to_host(x, d_x, (size_t)n * hidden * 4));
        int bad = 0;
        for (int t = 0; t < n; t++)
            for (int i = 0; i < hidden; i++)
                if (x[(size_t)t * hidden + i] != bf16_to_float(table[(size_t)ids[t] * hidden + i])) bad++;
        CHECK_MSG(bad == 0, "fallback %d: %d elements differ", with_fallback, bad);
        CHECK(guard_intact(d_x, (size_t)n * hidden * 4));
        kite_cuda_free(d_ids);
        kite_cuda_free(d_fallback);
        kite_cuda_free(d_x);
    }
    kite_cuda_free(d_table);
    free(table);
    free(x);
}

static void check_rmsnorm(int rows, int dim, int gather) {
    float *x = xmalloc((size_t)rows * dim * 4), *w = xmalloc((size_t)dim * 4);
    random_f32(x, (size_t)rows * dim, 3.0f);
    for (int i = 0; i < dim; i++) w[i] = 1.0f + 0.1f * rng_normal();
    int32_t index[3] = {rows - 1, 0, rows / 2};
    const int out_rows = gather ? 3 : rows;
    float *d_x = device_buffer((size_t)rows * dim * 4, x);
    float *d_w = device_buffer((size_t)dim * 4, w);
    int32_t *d_index = device_buffer(sizeof index, index);
    void *d_out = device_buffer((size_t)out_rows * dim * 2, NULL);
    DEVICE_CHECK(cuda_rmsnorm(d_x, d_w, d_out, gather ? d_index : NULL, out_rows, dim, 1e-6f, NULL));
    uint16_t *out = xmalloc((size_t)out_rows * dim * 2);
    float *outf = xmalloc((size_t)out_rows * dim * 4);
    double *ref = xmalloc((size_t)out_rows * dim * 8);
    DEVICE_CHECK(kite_cuda_copy_to_host(out, d_out, (size_t)out_rows * dim * 2));
    bf16_to_floats(out, outf, (size_t)out_rows * dim);
    for (int r = 0; r < out_rows; r++) {
        const float *xr = x + (size_t)(gather ? index[r] : r) * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        const double s = 1.0 / sqrt(ss / dim + 1e-6);
        for (int i = 0; i < dim; i++) ref[(size_t)r * dim + i] = xr[i] * s * w[i];
    }
    const double e = nmse(outf, ref, (size_t)out_rows * dim);
    CHECK_MSG(e < NMSE_BF16_OUT, "rmsnorm rows %d dim %d gather %d: nmse %g", rows, dim, gather, e);
    CHECK(guard_intact(d_out, (size_t)out_rows * dim * 2));
    kite_cuda_free(d_x);
    kite_cuda_free(d_w);
    kite_cuda_free(d_index);
    kite_cuda_free(d_out);
    free(x);
    free(w);
    free(out);
    free(outf);
    free(ref);
}

static void test_rmsnorm(void) {
    check_rmsnorm(5, 1024, 0);
    check_rmsnorm(9, 1028, 0);
    check_rmsnorm(9, 4100, 1);
}

/* x += the partials (in order), then the norm of the new x: both outputs against a host reference. */
static void check_residual_rmsnorm(int rows, int dim, int n_partials) {
    const size_t n = (size_t)rows * dim;
    float *x = xmalloc(n * 4), *parts = xmalloc(n * n_partials * 4), *w = xmalloc((size_t)dim * 4);
    float *x_out = xmalloc(n * 4), *outf = xmalloc(n * 4);
    uint16_t *out = xmalloc(n * 2);
    double *x_ref = xmalloc(n * 8), *ref = xmalloc(n * 8);
    random_f32(x, n, 1.0f);
    random_f32(parts, n * n_partials, 0.5f);
    for (int i = 0; i < dim; i++) w[i] = 1.0f + 0.1f * rng_normal();
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < dim; i++) {
            const size_t at = (size_t)r * dim + i;
            double v = x[at];
            for (int p = 0; p < n_partials; p++) v += parts[(size_t)p * n + at];
            x_ref[at] = v;
            ss += v * v;
        }
        const double scale = 1.0 / sqrt(ss / dim + 1e-6);
        for (int i = 0; i < dim; i++) ref[(size_t)r * dim + i] = x_ref[(size_t)r * dim + i] * scale * w[i];
    }
    float *d_x = device_buffer(n * 4, x), *d_parts = device_buffer(n * n_partials * 4, parts);
    float *d_w = device_buffer((size_t)dim * 4, w);
    void *d_out = device_buffer(n * 2, NULL);
    DEVICE_CHECK(cuda_residual_rmsnorm(d_x, d_parts, n_partials, d_w, d_out, rows, dim, 1e-6f, NULL));
    DEVICE_CHECK(kite_cuda_copy_to_host(x_out, d_x, n * 4));
    DEVICE_CHECK(kite_cuda_copy_to_host(out, d_out, n * 2));
    bf16_to_floats(out, outf, n);
    const double ex = nmse(x_out, x_ref, n), e = nmse(outf, ref, n);
    CHECK_MSG(ex < 1e-12, "residual_rmsnorm rows %d dim %d partials %d: residual nmse %g", rows, dim, n_partials, ex);
    CHECK_MSG(e < NMSE_BF16_OUT, "residual_rmsnorm rows %d dim %d partials %d: nmse %g", rows, dim, n_partials, e);
    CHECK(guard_intact(d_x, n * 4));
    CHECK(guard_intact(d_out, n * 2));
    kite_cuda_free(d_x);
    kite_cuda_free(d_parts);
    kite_cuda_free(d_w);
    kite_cuda_free(d_out);
    free(x);
    free(parts);
    free(w);
    free(x_out);
    free(outf);
    free(out);
    free(x_ref);
    free(ref);
}

static void test_residual_rmsnorm(void) {
    check_residual_rmsnorm(32, 1024, 4);
    check_residual_rmsnorm(3, 1028, 1);
    check_residual_rmsnorm(7, 4100, 3);
}

static void test_swiglu(void) {
    const int n = 5, inter = 3080;
    const size_t in_n = (size_t)n * 2 * inter, out_n = (size_t)n * inter;
    uint16_t *in = xmalloc(in_n * 2), *out = xmalloc(out_n * 2);
    float *inf_ = xmalloc(in_n * 4), *outf = xmalloc(out_n * 4);
    double *ref = xmalloc(out_n * 8);
    random_bf16(in, inf_, in_n, 2.0f);
    void *d_in = device_buffer(in_n * 2, in), *d_out = device_buffer(out_n * 2, NULL);
    DEVICE_CHECK(cuda_swiglu(d_in, d_out, n, inter, NULL));
    DEVICE_CHECK(kite_cuda_copy_to_host(out, d_out, out_n * 2));
    bf16_to_floats(out, outf, out_n);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < inter; i++) {
            const double g = inf_[(size_t)t * 2 * inter + i], u = inf_[(size_t)t * 2 * inter + inter + i];
            ref[(size_t)t * inter + i] = g / (1.0 + exp(-g)) * u;
        }
    const double e = nmse(outf, ref, out_n);
    CHECK_MSG(e < NMSE_BF16_OUT, "swiglu nmse %g", e);
    CHECK(guard_intact(d_out, out_n * 2));
    kite_cuda_free(d_in);
    kite_cuda_free(d_out);
    free(in);
    free(out);
    free(inf_);
    free(outf);
    free(ref);
}

/* ---- Q/K norm + RoPE + KV append ---------------------------------------------------------------- */

static void rope_tables(float *cos_t, float *sin_t, int positions, int head_dim, double theta) {
    const int half = head_dim / 2;
    for (int p = 0; p < positions; p++)
        for (int i = 0; i < half; i++) {
            const double a = (double)p * pow(theta, -2.0 * i / head_dim);
            cos_t[(size_t)p * half + i] = (float)cos(a);
            sin_t[(size_t)p * half + i] = (float)sin(a);
        }
}

static size_t kv_index(int block, int kind, int kv_head, int slot, int n_kv, int bs, int d) {
    return ((((size_t)block * 2 + kind) * n_kv + kv_head) * bs + slot) * d;
}

static void check_qk_norm_rope(int io_f32, int n_heads, int n_kv, int n_tokens) {
    const int D = 128, bs = 16, n_blocks = 8, positions = 4096, half = 64;
    const int width = (n_heads + 2 * n_kv) * D;
    const size_t qkv_n = (size_t)n_tokens * width, q_n = (size_t)n_tokens * n_heads * D;
    const size_t cache_n = (size_t)n_blocks * 2 * n_kv * bs * D;
    float *qkv = xmalloc(qkv_n * 4);
    uint16_t *qkv_bits = xmalloc(qkv_n * 2);
    random_bf16(qkv_bits, qkv, qkv_n, 1.5f); /* bf16-exact values serve both dtypes */
    float qn[128], kn[128];
    for (int i = 0; i < D; i++) {
        qn[i] = 1.0f + 0.1f * rng_normal();
        kn[i] = 1.0f + 0.1f * rng_normal();
    }
    float *cos_t = xmalloc((size_t)positions * half * 4), *sin_t = xmalloc((size_t)positions * half * 4);
    rope_tables(cos_t, sin_t, positions, D, 1000000.0);
    int32_t pos[16], slots[16];
    for (int t = 0; t < n_tokens; t++) {
        pos[t] = (int32_t)(rng_next() % positions);
        slots[t] = (t * 37 + 5) % (n_blocks * bs); /* distinct for t < 128 / gcd */
    }
    void *d_qkv = device_buffer(qkv_n * (io_f32 ? 4 : 2), io_f32 ? (void *)qkv : (void *)qkv_bits);
    void *d_q = device_buffer(q_n * (io_f32 ? 4 : 2), NULL);
    int32_t *d_pos = device_buffer(sizeof pos, pos), *d_slots = device_buffer(sizeof slots, slots);
    float *d_qn = device_buffer(sizeof qn, qn), *d_kn = device_buffer(sizeof kn, kn);
    float *d_cos = device_buffer((size_t)positions * half * 4, cos_t), *d_sin = device_buffer((size_t)positions * half * 4, sin_t);
    void *d_cache = device_buffer(cache_n * 2, NULL);
    cuda_kv_layer kv = {d_cache, bs, n_kv, D, 0, KITE_KV_CACHE_BF16};
    DEVICE_CHECK(cuda_qk_norm_rope_kv(d_qkv, d_q, io_f32, d_pos, d_slots, d_qn, d_kn, d_cos, d_sin, kv, n_tokens, n_heads,
                                      1e-6f, NULL, 0));
    float *q_out = xmalloc(q_n * 4);
    uint16_t *cache = xmalloc(cache_n * 2);
    if (io_f32) {
        DEVICE_CHECK(kite_cuda_copy_to_host(q_out, d_q, q_n * 4));
    } else {
        uint16_t *bits = xmalloc(q_n * 2);
        DEVICE_CHECK(kite_cuda_copy_to_host(bits, d_q, q_n * 2));
        bf16_to_floats(bits, q_out, q_n);
        free(bits);
    }
    DEVICE_CHECK(kite_cuda_copy_to_host(cache, d_cache, cache_n * 2));

    double *q_ref = xmalloc(q_n * 8);
    const size_t kv_n = (size_t)n_tokens * n_kv * D;
    double *k_ref = xmalloc(kv_n * 8), *v_ref = xmalloc(kv_n * 8);
    float *k_got = xmalloc(kv_n * 4), *v_got = xmalloc(kv_n * 4);
    char *written = calloc(cache_n, 1);
    for (int t = 0; t < n_tokens; t++) {
        for (int h = 0; h < n_heads + n_kv; h++) {
            const float *src = qkv + (size_t)t * width + (size_t)h * D;
            const float *w = h < n_heads ? qn : kn;
            double ss = 0, y[128];
            for (int i = 0; i < D; i++) ss += (double)src[i] * src[i];
            const double s = 1.0 / sqrt(ss / D + 1e-6);
            for (int i = 0; i < D; i++) y[i] = src[i] * s * w[i];
            double *dst = h < n_heads ? q_ref + ((size_t)t * n_heads + h) * D : k_ref + ((size_t)t * n_kv + h - n_heads) * D;
            for (int i = 0; i < half; i++) {
                const double c = cos_t[(size_t)pos[t] * half + i], sn = sin_t[(size_t)pos[t] * half + i];
                dst[i] = y[i] * c - y[i + half] * sn;
                dst[i + half] = y[i + half] * c + y[i] * sn;
            }
        }
        const int block = slots[t] / bs, slot = slots[t] % bs;
        for (int h = 0; h < n_kv; h++) {
            const float *v = qkv + (size_t)t * width + (size_t)(n_heads + n_kv + h) * D;
            for (int i = 0; i < D; i++) {
                const size_t kk = kv_index(block, 0, h, slot, n_kv, bs, D) + i, vv = kv_index(block, 1, h, slot, n_kv, bs, D) + i;
                v_ref[((size_t)t * n_kv + h) * D + i] = v[i];
                k_got[((size_t)t * n_kv + h) * D + i] = bf16_to_float(cache[kk]);
                v_got[((size_t)t * n_kv + h) * D + i] = bf16_to_float(cache[vv]);
                written[kk] = written[vv] = 1;
            }
        }
    }
    int untouched_bad = 0;
    for (size_t i = 0; i < cache_n; i++)
        if (!written[i] && cache[i] != 0xFFFF) untouched_bad++;
    const double eq = nmse(q_out, q_ref, q_n), ek = nmse(k_got, k_ref, kv_n), ev = nmse(v_got, v_ref, kv_n);
    CHECK_MSG(eq < (io_f32 ? 1e-10 : NMSE_BF16_OUT), "q nmse %g (f32 %d)", eq, io_f32);
    CHECK_MSG(ek < NMSE_BF16_OUT, "k nmse %g", ek);
    CHECK_MSG(ev == 0.0, "v nmse %g", ev);
    CHECK_MSG(untouched_bad == 0, "%d cache elements outside the new slots changed", untouched_bad);
    CHECK(guard_intact(d_q, q_n * (io_f32 ? 4 : 2)));
    CHECK(guard_intact(d_cache, cache_n * 2));
    void *bufs[] = {d_qkv, d_q, d_pos, d_slots, d_qn, d_kn, d_cos, d_sin, d_cache};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kite_cuda_free(bufs[i]);
    free(qkv);
    free(qkv_bits);
    free(cos_t);
    free(sin_t);
    free(q_out);
    free(cache);
    free(q_ref);
    free(k_ref);
    free(v_ref);
    free(k_got);
    free(v_got);
    free(written);
}

static void test_qk_norm_rope(void) {
    check_qk_norm_rope(0, 16, 8, 5);
    check_qk_norm_rope(1, 16, 8, 1);
    check_qk_norm_rope(0, 6, 2, 11);
    check_qk_norm_rope(1, 32, 8, 3);
}

/* ---- attention ------------------------------------------------------------------------------------ */

typedef struct paged_cache {
    int n_blocks, bs, n_kv, D;
    uint16_t *bits;  /* host copy */
    void *device;
} paged_cache;

static paged_cache make_cache(int n_blocks, int bs, int n_kv) {
    paged_cache c = {n_blocks, bs, n_kv, 128, NULL, NULL};
    const size_t n = (size_t)n_blocks * 2 * n_kv * bs * 128;
    c.bits = xmalloc(n * 2);
    random_bf16(c.bits, NULL, n, 1.0f);
    c.device = device_buffer(n * 2, c.bits);
    return c;
}

static float cache_at(const paged_cache *c, const int32_t *table, int kind, int kv_head, int position, int i) {
    return bf16_to_float(c->bits[kv_index(table[position / c->bs], kind, kv_head, position % c->bs, c->n_kv, c->bs, c->D) + i]);
}

/* out[h][i] for one query (fp32 values q) at position `position`, attending to [0, position]. */
static void attention_ref(const paged_cache *c, const int32_t *table, const float *q, int n_heads, int position,
                          double *out) {
    const int D = c->D, group = n_heads / c->n_kv;
    const double scale = 1.0 / sqrt((double)D);
    double *w = xmalloc((size_t)(position + 1) * 8);
    for (int h = 0; h < n_heads; h++) {
        const int kvh = h / group;
        double mx = -INFINITY;
        for (int p = 0; p <= position; p++) {
            double s = 0;
            for (int i = 0; i < D; i++) s += (double)q[h * D + i] * cache_at(c, table, 0, kvh, p, i);
            w[p] = s * scale;
            if (w[p] > mx) mx = w[p];
        }
        double sum = 0;
        for (int p = 0; p <= position; p++) sum += (w[p] = exp(w[p] - mx));
        for (int i = 0; i < D; i++) {
            double acc = 0;
            for (int p = 0; p <= position; p++) acc += w[p] * cache_at(c, table, 1, kvh, p, i);
            out[h * D + i] = acc / sum;
        }
    }
    free(w);
}

static void make_tables(int32_t *tables, int n_seqs, int per_seq, int n_blocks) {
    /* A permutation of the blocks, so each sequence's blocks are scattered. */
    int32_t *perm = xmalloc((size_t)n_blocks * 4);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        const int j = (int)(rng_next() % (uint64_t)(i + 1));
        const int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < n_seqs * per_seq; i++) tables[i] = perm[i % n_blocks];
    free(perm);
}

static void check_attention_prefill(int n_heads, int n_kv, int bs, int n_seqs, const int *n_new, const int *ctx) {
    const int D = 128, per_seq = 64;
    const int n_blocks = n_seqs * per_seq;
    paged_cache c = make_cache(n_blocks, bs, n_kv);
    int32_t *tables = xmalloc((size_t)n_seqs * per_seq * 4);
    make_tables(tables, n_seqs, per_seq, n_blocks);
    int32_t token_start[9], table_start[8], ctx32[8];
    int T = 0, max_new = 0;
    for (int s = 0; s < n_seqs; s++) {
        token_start[s] = T;
        T += n_new[s];
        table_start[s] = s * per_seq;
        ctx32[s] = ctx[s];
        if (n_new[s] > max_new) max_new = n_new[s];
    }
    token_start[n_seqs] = T;
    const size_t qn = (size_t)T * n_heads * D;
    uint16_t *q_bits = xmalloc(qn * 2), *out_bits = xmalloc(qn * 2);
    float *q = xmalloc(qn * 4), *out = xmalloc(qn * 4);
    double *ref = xmalloc(qn * 8);
    random_bf16(q_bits, q, qn, 1.0f);
    void *d_q = device_buffer(qn * 2, q_bits), *d_out = device_buffer(qn * 2, NULL);
    int32_t *d_ts = device_buffer(sizeof token_start, token_start), *d_ctx = device_buffer(sizeof ctx32, ctx32);
    int32_t *d_tstart = device_buffer(sizeof table_start, table_start);
    int32_t *d_tables = device_buffer((size_t)n_seqs * per_seq * 4, tables);
    cuda_kv_layer kv = {c.device, bs, n_kv, D, c.n_blocks, KITE_KV_CACHE_BF16};
    cuda_seq_meta meta = {d_ts, d_ctx, d_tstart, d_tables, n_seqs, max_new};
    DEVICE_CHECK(cuda_attention_prefill(d_q, d_out, kv, meta, n_heads, 1.0f / sqrtf((float)D), NULL));
    DEVICE_CHECK(kite_cuda_copy_to_host(out_bits, d_out, qn * 2));
    bf16_to_floats(out_bits, out, qn);
    for (int s = 0; s < n_seqs; s++)
        for (int i = 0; i < n_new[s]; i++) {
            const int t = token_start[s] + i;
            attention_ref(&c, tables + (size_t)s * per_seq, q + (size_t)t * n_heads * D, n_heads, ctx[s] - n_new[s] + i,
                          ref + (size_t)t * n_heads * D);
        }
    const double e = nmse(out, ref, qn);
    CHECK_MSG(e < NMSE_ATTENTION, "prefill attention heads %d/%d bs %d seqs %d: nmse %g", n_heads, n_kv, bs, n_seqs, e);
    CHECK(guard_intact(d_out, qn * 2));
    void *bufs[] = {d_q, d_out, d_ts, d_ctx, d_tstart, d_tables, c.device};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kite_cuda_free(bufs[i]);
    free(c.bits);
    free(tables);
    free(q_bits);
    free(out_bits);
    free(q);
    free(out);
    free(ref);
}

static void test_attention_prefill(void) {
    /* A fresh prompt not a multiple of 64, a chunk after earlier context, a single decode token. */
    const int n_new_a[3] = {70, 5, 1}, ctx_a[3] = {70, 133, 300};
    check_attention_prefill(4, 2, 16, 3, n_new_a, ctx_a);
    const int n_new_b[1] = {200}, ctx_b[1] = {777};
    check_attention_prefill(16, 8, 32, 1, n_new_b, ctx_b);
    const int n_new_c[2] = {64, 129}, ctx_c[2] = {64, 129};
    check_attention_prefill(6, 2, 16, 2, n_new_c, ctx_c);
    const int n_new_d[1] = {17}, ctx_d[1] = {2000};
    check_attention_prefill(8, 8, 64, 1, n_new_d, ctx_d);
    /* Blocks of a multiple of 128 positions take the wgmma + TMA kernel: a long fresh prompt, a chunk after
     * earlier context, one token; rows that fill one warpgroup of a tile only; 4 heads per kv head, 256-position
     * blocks. */
    const int n_new_e[3] = {1000, 130, 1}, ctx_e[3] = {1000, 4000, 300};
    check_attention_prefill(16, 8, 128, 3, n_new_e, ctx_e);
    const int n_new_f[2] = {129, 200}, ctx_f[2] = {129, 777};
    check_attention_prefill(4, 4, 128, 2, n_new_f, ctx_f);
    const int n_new_g[2] = {300, 64}, ctx_g[2] = {2100, 64};
    check_attention_prefill(8, 2, 256, 2, n_new_g, ctx_g);
}

/* q (n_heads, D) and the new k, v (n_kv, D) from a QKV row: RMSNorm * weight then RoPE at `position`. */
static void norm_rope_ref(const float *src, const float *w, const float *cos_t, const float *sin_t, int position,
                          double *dst) {
    const int D = 128, half = 64;
    double ss = 0, y[128];
    for (int i = 0; i < D; i++) ss += (double)src[i] * src[i];
    const double s = 1.0 / sqrt(ss / D + 1e-6);
    for (int i = 0; i < D; i++) y[i] = src[i] * s * w[i];
    for (int i = 0; i < half; i++) {
        const double c = cos_t[(size_t)position * half + i], sn = sin_t[(size_t)position * half + i];
        dst[i] = y[i] * c - y[i + half] * sn;
        dst[i + half] = y[i + half] * c + y[i] * sn;
    }
}

/* cluster 0: the split-K kernel with n_splits; else the bulk-copy fed cluster kernel with clusters of that many
 * blocks. */
/* q_gain scales the query norm weights, so the scores' spread: at 10 (about 14 in base 2) a stream's running max
 * moves past the split-K kernel's deferred-rescale margin (2^8) many times, and a few positions carry the softmax. */
static void check_attention_decode_gain(int n_heads, int n_kv, int bs, int ctx, int n_splits, int cluster,
                                        float q_gain) {
    const int D = 128, n_blocks = KITE_TEST_CEIL(ctx, bs) + 3, half = 64, positions = ctx + 1;
    paged_cache c = make_cache(n_blocks, bs, n_kv);
    int32_t *table = xmalloc((size_t)n_blocks * 4);
    make_tables(table, 1, n_blocks, n_blocks);
    const size_t qn = (size_t)n_heads * D, width = (size_t)(n_heads + 2 * n_kv) * D;
    float *qkv = xmalloc(width * 4), *q = xmalloc(qn * 4), *out = xmalloc(qn * 4);
    double *ref = xmalloc(qn * 8), row[128];
    random_f32(qkv, width, 1.0f);
    float qn_w[128], kn_w[128];
    for (int i = 0; i < D; i++) {
        qn_w[i] = q_gain * (1.0f + 0.1f * rng_normal());
        kn_w[i] = 1.0f + 0.1f * rng_normal();
    }
    float *cos_t = xmalloc((size_t)positions * half * 4), *sin_t = xmalloc((size_t)positions * half * 4);
    rope_tables(cos_t, sin_t, positions, D, 1000000.0);
    const int position = ctx - 1;
    /* Reference: the query heads, and the new K (rounded to bf16 as the cache stores it) and V written
     * into the host copy of the cache. */
    for (int h = 0; h < n_heads; h++) {
        norm_rope_ref(qkv + (size_t)h * D, qn_w, cos_t, sin_t, position, row);
        for (int i = 0; i < D; i++) q[h * D + i] = (float)row[i];
    }
    const int blk = table[position / bs], slot = position % bs;
    for (int h = 0; h < n_kv; h++) {
        norm_rope_ref(qkv + (size_t)(n_heads + h) * D, kn_w, cos_t, sin_t, position, row);
        for (int i = 0; i < D; i++) {
            c.bits[kv_index(blk, 0, h, slot, n_kv, bs, D) + i] = float_to_bf16((float)row[i]);
            c.bits[kv_index(blk, 1, h, slot, n_kv, bs, D) + i] = float_to_bf16(qkv[(size_t)(n_heads + n_kv + h) * D + i]);
        }
    }
    int32_t ctx32 = ctx;
    float *d_qkv = device_buffer(width * 4, qkv), *d_out = device_buffer(qn * 4, NULL);
    int32_t *d_table = device_buffer((size_t)n_blocks * 4, table), *d_ctx = device_buffer(4, &ctx32);
    float *d_qn = device_buffer(sizeof qn_w, qn_w), *d_kn = device_buffer(sizeof kn_w, kn_w);
    float *d_cos = device_buffer((size_t)positions * half * 4, cos_t), *d_sin = device_buffer((size_t)positions * half * 4, sin_t);
    const size_t ws_bytes = cuda_attention_decode_workspace(n_heads, D, n_splits);
    void *d_ws = device_buffer(ws_bytes, NULL);
    unsigned *d_counters = device_buffer((size_t)n_heads * 4, NULL);
    DEVICE_CHECK(kite_cuda_memset(d_counters, 0, (size_t)n_heads * 4));
    cuda_kv_layer kv = {c.device, bs, n_kv, D, c.n_blocks, KITE_KV_CACHE_BF16};
    for (int run = 0; run < 2; run++) { /* twice: the counters must come back to zero */
        DEVICE_CHECK(kite_cuda_memset(d_out, POISON, qn * 4));
        if (cluster)
            DEVICE_CHECK(cuda_attention_decode_bulk(d_qkv, d_out, kv, d_table, d_ctx, d_qn, d_kn, d_cos, d_sin, 1e-6f,
                                                    n_heads, 1.0f / sqrtf((float)D), cluster, NULL, run));
        else
            DEVICE_CHECK(cuda_attention_decode(d_qkv, d_out, kv, d_table, d_ctx, d_qn, d_kn, d_cos, d_sin, 1e-6f,
                                               n_heads, 1.0f / sqrtf((float)D), n_splits, d_ws, d_counters, NULL, run));
        DEVICE_CHECK(kite_cuda_copy_to_host(out, d_out, qn * 4));
        if (run == 0) {
            /* The reference attends to the new K and V rows as the kernel stored them, once they are checked to be
             * within 1% of the host's: the kernel rounds an fp32 K to bf16, the host a double one, and a flipped
             * last bit of the new row would weigh in the comparison where one position carries the softmax. */
            uint16_t row_bits[128];
            size_t row_differ = 0;
            for (int h = 0; h < n_kv; h++)
                for (int kind = 0; kind < 2; kind++) {
                    const size_t at = kv_index(blk, kind, h, slot, n_kv, bs, D);
                    DEVICE_CHECK(kite_cuda_copy_to_host(row_bits, (uint16_t *)c.device + at, (size_t)D * 2));
                    for (int i = 0; i < D; i++) {
                        const float a = bf16_to_float(row_bits[i]), b = bf16_to_float(c.bits[at + i]);
                        if (fabsf(a - b) > 1e-2f * fabsf(b) + 1e-6f) row_differ++;
                        c.bits[at + i] = row_bits[i];
                    }
                }
            CHECK_MSG(row_differ == 0, "%zu elements of the appended K/V rows differ from the reference", row_differ);
            attention_ref(&c, table, q, n_heads, position, ref);
        }
        const double e = nmse(out, ref, qn);
        CHECK_MSG(e < 1e-8, "decode attention heads %d/%d ctx %d splits %d cluster %d run %d: nmse %g", n_heads, n_kv,
                  ctx, n_splits, cluster, run, e);
    }
    /* The cache equals the host copy: the new row appended, nothing else touched. */
    const size_t cache_n = (size_t)n_blocks * 2 * n_kv * bs * D;
    uint16_t *got = xmalloc(cache_n * 2);
    DEVICE_CHECK(kite_cuda_copy_to_host(got, c.device, cache_n * 2));
    size_t differ = 0;
    for (size_t i = 0; i < cache_n; i++) {
        const float a = bf16_to_float(got[i]), b = bf16_to_float(c.bits[i]);
        if (fabsf(a - b) > 1e-2f * fabsf(b) + 1e-6f) differ++;
    }
    CHECK_MSG(differ == 0, "%zu cache elements differ from the reference after the append", differ);
    unsigned counters[64];
    DEVICE_CHECK(kite_cuda_copy_to_host(counters, d_counters, (size_t)n_heads * 4));
    int nonzero = 0;
    for (int i = 0; i < n_heads; i++) nonzero += counters[i] != 0;
    CHECK_MSG(nonzero == 0, "%d counters left non-zero", nonzero);
    CHECK(guard_intact(d_out, qn * 4));
    CHECK(guard_intact(c.device, cache_n * 2));
    void *bufs[] = {d_qkv, d_out, d_table, d_ctx, d_qn, d_kn, d_cos, d_sin, d_ws, d_counters, c.device};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kite_cuda_free(bufs[i]);
    free(c.bits);
    free(table);
    free(qkv);
    free(q);
    free(out);
    free(ref);
    free(cos_t);
    free(sin_t);
    free(got);
}

static void check_attention_decode(int n_heads, int n_kv, int bs, int ctx, int n_splits, int cluster) {
    check_attention_decode_gain(n_heads, n_kv, bs, ctx, n_splits, cluster, 1.0f);
}

static void test_attention_decode(void) {
    check_attention_decode(16, 8, 16, 1, 64, 0);
    check_attention_decode(16, 8, 16, 37, 7, 0);
    check_attention_decode(16, 8, 32, 1000, 66, 0);
    check_attention_decode(8, 2, 16, 515, 16, 0);  /* group of 4 */
    check_attention_decode(6, 2, 16, 300, 5, 0);   /* group of 3: one head per block */
    check_attention_decode(32, 8, 64, 4099, 33, 0);
    check_attention_decode(16, 8, 16, 16384, 66, 0);
    check_attention_decode(16, 8, 16, 16384, 200, 0); /* more splits than threads: the combine in two passes */
    check_attention_decode(6, 2, 16, 9000, 150, 0);   /* the same with one head per block */
    check_attention_decode_gain(16, 8, 128, 1000, 66, 0, 10.0f); /* peaky scores: many deferred rescales */
}

/* The bulk-copy fed cluster kernel: contexts shorter than the cluster (empty blocks), inside one
 * tile per block, across the shared-memory stages (more tiles than stages), groups of 1, 2 and 4 query heads;
 * both cluster sizes where the device runs them. */
static void test_attention_decode_bulk(void) {
    const cuda_kv_layer shape = {NULL, 16, 8, 128, 0, KITE_KV_CACHE_BF16};
    const int largest = cuda_attention_decode_bulk_size(16, shape);
    CHECK_MSG(largest == 8 || largest == 16, "cluster size %d for 16/8 heads", largest);
    for (int cluster = 8; cluster <= largest; cluster *= 2) {
        check_attention_decode(16, 8, 16, 1, 0, cluster);
        check_attention_decode(16, 8, 16, 5, 0, cluster);
        check_attention_decode(16, 8, 16, 37, 0, cluster);
        check_attention_decode(16, 8, 32, 383, 0, cluster);
        check_attention_decode(8, 2, 16, 515, 0, cluster); /* group of 4 */
        check_attention_decode(6, 2, 16, 300, 0, cluster); /* group of 3: one head per cluster */
        check_attention_decode(32, 8, 64, 4099, 0, cluster);
        check_attention_decode(16, 8, 16, 16384, 0, cluster);
        check_attention_decode_gain(16, 8, 128, 1000, 0, cluster, 10.0f); /* peaky scores */
    }
}

/* ---- GEMV, argmax, GEMM --------------------------------------------------------------------------- */

static void check_gemv(int rows, int cols, int epilogue, int with_norm) {
    const size_t wn = (size_t)rows * cols;
    uint16_t *w_bits = xmalloc(wn * 2);
    float *w = xmalloc(wn * 4), *x = xmalloc((size_t)cols * 4), *g = xmalloc((size_t)cols * 4);
    random_bf16(w_bits, w, wn, 0.05f);
    random_f32(x, (size_t)cols, 1.0f);
    for (int i = 0; i < cols; i++) g[i] = 1.0f + 0.1f * rng_normal();
    const int outputs = epilogue == CUDA_GEMV_SWIGLU ? rows / 2 : rows;
    float *y0 = xmalloc((size_t)outputs * 4), *y = xmalloc((size_t)outputs * 4);
    double *ref = xmalloc((size_t)outputs * 8), *in = xmalloc((size_t)cols * 8), *dots = xmalloc((size_t)rows * 8);
    random_f32(y0, (size_t)outputs, 1.0f);
    double ss = 0;
    for (int i = 0; i < cols; i++) ss += (double)x[i] * x[i];
    const double s = with_norm ? 1.0 / sqrt(ss / cols + 1e-6) : 1.0;
    for (int i = 0; i < cols; i++) in[i] = with_norm ? x[i] * s * g[i] : x[i];
    for (int r = 0; r < rows; r++) {
        double acc = 0;
        for (int i = 0; i < cols; i++) acc += (double)w[(size_t)r * cols + i] * in[i];
        dots[r] = acc;
    }
    for (int o = 0; o < outputs; o++) {
        if (epilogue == CUDA_GEMV_SWIGLU) ref[o] = dots[o] / (1.0 + exp(-dots[o])) * dots[o + outputs];
        else if (epilogue == CUDA_GEMV_ADD || epilogue == CUDA_GEMV_ADD_SETTLED) ref[o] = y0[o] + dots[o];
        else ref[o] = dots[o];
    }
    void *d_w = device_buffer(wn * 2, w_bits);
    float *d_x = device_buffer((size_t)cols * 4, x), *d_g = device_buffer((size_t)cols * 4, g);
    const int adds = epilogue == CUDA_GEMV_ADD || epilogue == CUDA_GEMV_ADD_SETTLED;
    float *d_y = device_buffer((size_t)outputs * 4, adds ? y0 : NULL);
    void *d_ws = device_buffer(cuda_gemv_argmax_workspace(rows), NULL);
    int32_t *d_id = device_buffer(4, NULL);
    DEVICE_CHECK(cuda_gemv(d_w, d_x, with_norm ? d_g : NULL, 1e-6f, d_y, rows, cols, epilogue, d_ws, d_id, NULL, 1));
    DEVICE_CHECK(kite_cuda_copy_to_host(y, d_y, (size_t)outputs * 4));
    const double e = nmse(y, ref, (size_t)outputs);
    CHECK_MSG(e < 1e-9, "gemv %d x %d epilogue %d norm %d: nmse %g", rows, cols, epilogue, with_norm, e);
    CHECK(guard_intact(d_y, (size_t)outputs * 4));
    if (epilogue == CUDA_GEMV_ARGMAX) {
        int32_t id = -1;
        DEVICE_CHECK(kite_cuda_copy_to_host(&id, d_id, 4));
        int best = 0;
        for (int r = 1; r < rows; r++)
            if (y[r] > y[best]) best = r;
        CHECK_MSG(id == best, "gemv argmax %d, expected %d", id, best);
        CHECK(guard_intact(d_id, 4));
    }
    void *bufs[] = {d_w, d_x, d_g, d_y, d_ws, d_id};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kite_cuda_free(bufs[i]);
    free(w_bits);
    free(w);
    free(x);
    free(g);
    free(y0);
    free(y);
    free(ref);
    free(in);
    free(dots);
}

static void test_gemv(void) {
    check_gemv(1000, 1024, CUDA_GEMV_STORE, 1);
    check_gemv(4096, 1024, CUDA_GEMV_STORE, 1);
    check_gemv(1000, 520, CUDA_GEMV_STORE, 0);
    check_gemv(1024, 2048, CUDA_GEMV_ADD, 0);
    check_gemv(1000, 3072, CUDA_GEMV_ADD, 0);
    check_gemv(1024, 2048, CUDA_GEMV_ADD_SETTLED, 0);
    check_gemv(1000, 3072, CUDA_GEMV_ADD_SETTLED, 0);
    check_gemv(2048, 6144, CUDA_GEMV_ADD_SETTLED, 0); /* several steps per task */
    check_gemv(9000, 1000, CUDA_GEMV_ADD_SETTLED, 0); /* several tasks per warp */
    check_gemv(6144, 1024, CUDA_GEMV_SWIGLU, 1);
    check_gemv(1002, 2056, CUDA_GEMV_SWIGLU, 1);
    check_gemv(12288, 2048, CUDA_GEMV_SWIGLU, 1); /* more tasks than warps: 2 rows per task */
    check_gemv(9002, 1032, CUDA_GEMV_SWIGLU, 1);
    check_gemv(151936, 1024, CUDA_GEMV_ARGMAX, 1);
    check_gemv(999, 2048, CUDA_GEMV_ARGMAX, 1);
    check_gemv(1000, 6144, CUDA_GEMV_ARGMAX, 1); /* 48 KB staged: dynamic and static shared memory past 48 KB */
}

/* The screened lm_head against cuda_gemv's ARGMAX on the same input: with every row a candidate its exact logits
 * must be the GEMV's bit for bit (the screen's premise), and screened, the same id. What is planted: 0 nothing; 1 the
 * best row copied to a higher id (a tie: the lower id wins) and a row one bf16 step off it; 2 a row with +inf and
 * one with NaN (a NaN logit allows no token: id -1, ARGMAX_NO_TOKEN); 3 every row the same (all tie: id 0, every row
 * a candidate); 4 a NaN in the input (every logit NaN: id -1, as the GEMV says). */
static void check_lm_head_screen(int rows, int cols, int plant) {
    const size_t wn = (size_t)rows * cols;
    uint16_t *w_bits = xmalloc(wn * 2);
    float *x = xmalloc((size_t)cols * 4), *g = xmalloc((size_t)cols * 4);
    float *y = xmalloc((size_t)rows * 4), *y_exact = xmalloc((size_t)rows * 4);
    random_bf16(w_bits, NULL, wn, 0.05f);
    random_f32(x, (size_t)cols, 1.0f);
    for (int i = 0; i < cols; i++) g[i] = 1.0f + 0.1f * rng_normal();
    if (plant == 3)
        for (int r = 1; r < rows; r++) memcpy(w_bits + (size_t)r * cols, w_bits, (size_t)cols * 2);
    if (plant == 4) x[cols / 3] = NAN;
    void *d_w = device_buffer(wn * 2, w_bits);
    float *d_x = device_buffer((size_t)cols * 4, x), *d_g = device_buffer((size_t)cols * 4, g);
    float *d_y = device_buffer((size_t)rows * 4, NULL), *d_exact = device_buffer((size_t)rows * 4, NULL);
    void *d_ws = device_buffer(cuda_gemv_argmax_workspace(rows), NULL);
    int32_t *d_id = device_buffer(4, NULL), *d_screened = device_buffer(4, NULL);
    if (plant == 1 || plant == 2) { /* plant after a first product says which row is best */
        DEVICE_CHECK(cuda_gemv(d_w, d_x, d_g, 1e-6f, d_y, rows, cols, CUDA_GEMV_ARGMAX, d_ws, d_id, NULL, 1));
        int32_t best = -1;
        DEVICE_CHECK(kite_cuda_copy_to_host(&best, d_id, 4));
        CHECK(best >= 0 && best < rows);
        const int copy_to = (best + rows / 2) % rows, near = (best + rows / 3) % rows;
        uint16_t *row = w_bits + (size_t)best * cols;
        if (plant == 1) {
            memcpy(w_bits + (size_t)copy_to * cols, row, (size_t)cols * 2);
            memcpy(w_bits + (size_t)near * cols, row, (size_t)cols * 2);
            w_bits[(size_t)near * cols + 7] ^= 1; /* one step of the last bf16 bit */
        } else {
            w_bits[(size_t)copy_to * cols + 5] = 0x7f80; /* +inf */
            w_bits[(size_t)near * cols + 9] = 0x7fc0;    /* NaN */
        }
        DEVICE_CHECK(kite_cuda_copy_to_device(d_w, w_bits, wn * 2));
    }
    void *d_screen = NULL;
    DEVICE_CHECK(kite_cuda_malloc(&d_screen, cuda_lm_head_screen_bytes(rows, cols)));
    DEVICE_CHECK(cuda_lm_head_screen_build(d_w, rows, cols, d_screen, NULL));
    DEVICE_CHECK(cuda_gemv(d_w, d_x, d_g, 1e-6f, d_y, rows, cols, CUDA_GEMV_ARGMAX, d_ws, d_id, NULL, 1));
    float *d_bounds = device_buffer((size_t)rows * 8, NULL), *bounds = xmalloc((size_t)rows * 8);
    DEVICE_CHECK(cuda_lm_head_screened_argmax(d_w, d_screen, d_x, d_g, 1e-6f, rows, cols, d_screened, d_exact, d_bounds, 1,
                                              NULL, 1));
    DEVICE_CHECK(kite_cuda_copy_to_host(bounds, d_bounds, (size_t)rows * 8));
    int32_t id = -1, screened = -2;
    DEVICE_CHECK(kite_cuda_copy_to_host(y, d_y, (size_t)rows * 4));
    DEVICE_CHECK(kite_cuda_copy_to_host(y_exact, d_exact, (size_t)rows * 4));
    DEVICE_CHECK(kite_cuda_copy_to_host(&id, d_id, 4));
    DEVICE_CHECK(kite_cuda_copy_to_host(&screened, d_screened, 4));
    CHECK_MSG(memcmp(y, y_exact, (size_t)rows * 4) == 0, "screen %d x %d plant %d: exact logits differ from the GEMV's",
              rows, cols, plant);
    CHECK_MSG(screened == id, "screen %d x %d plant %d, every row: id %d, the GEMV's %d", rows, cols, plant, screened, id);
    /* The screen's premise, row by row: the exact logit lies within its bound of the estimate. */
    int outside = 0;
    double widest = 0.0; /* the largest |exact - estimate| / bound: how tight the bound is */
    for (int r = 0; r < rows; r++) {
        const float approx = bounds[2 * r], bound = bounds[2 * r + 1];
        if (!isfinite(y[r]) || !isfinite(approx) || !isfinite(bound)) continue; /* such rows are always candidates */
        const double gap = fabs((double)y[r] - (double)approx);
        outside += gap > (double)bound;
        if (bound > 0 && gap / bound > widest) widest = gap / bound;
    }
    CHECK_MSG(outside == 0, "screen %d x %d plant %d: %d rows' exact logits outside their bounds", rows, cols, plant, outside);
    unsigned candidates = 0;
    for (int pass = 0; pass < 2; pass++) { /* twice: the second launch finds the counters reset */
        screened = -2;
        DEVICE_CHECK(kite_cuda_memset(d_screened, 0xff, 4));
        DEVICE_CHECK(cuda_lm_head_screened_argmax(d_w, d_screen, d_x, d_g, 1e-6f, rows, cols, d_screened, NULL, NULL, 0,
                                                  NULL, 1));
        DEVICE_CHECK(kite_cuda_copy_to_host(&screened, d_screened, 4));
        CHECK_MSG(screened == id, "screen %d x %d plant %d pass %d: id %d, the GEMV's %d", rows, cols, plant, pass,
                  screened, id);
        DEVICE_CHECK(cuda_lm_head_screen_candidates(d_screen, rows, cols, &candidates));
        CHECK_MSG(candidates >= 1 && candidates <= (unsigned)rows, "screen %d x %d: %u candidates", rows, cols, candidates);
    }
    if (plant == 3 || plant == 4)
        CHECK_MSG(candidates == (unsigned)rows && id == (plant == 3 ? 0 : -1), "screen plant %d: %u of %d rows candidates, id %d",
                  plant, candidates, rows, id);
    if (plant == 2) CHECK_MSG(id == -1, "screen plant 2 (a NaN row): id %d, not -1", id);
    if (plant == 1 && rows >= 100) CHECK_MSG(candidates >= 3, "screen: the tie and the near row must be candidates (%u)", candidates);
    printf("  lm_head screen %d x %d, plant %d: id %d, %u candidate rows, |exact - estimate| at most %.3f of the bound\n",
           rows, cols, plant, id, candidates, widest);
    CHECK(guard_intact(d_screened, 4));
    CHECK(guard_intact(d_exact, (size_t)rows * 4));
    CHECK(guard_intact(d_bounds, (size_t)rows * 8));
    void *bufs[] = {d_w, d_x, d_g, d_y, d_exact, d_ws, d_id, d_screened, d_screen, d_bounds};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kite_cuda_free(bufs[i]);
    free(w_bits);
    free(x);
    free(g);
    free(y);
    free(y_exact);
    free(bounds);
}

static void test_lm_head_screen(void) {
    CHECK(cuda_lm_head_screen_fits(151936, 1024) && !cuda_lm_head_screen_fits(1000, 1032));
    check_lm_head_screen(151936, 1024, 0); /* Qwen3-0.6B */
    check_lm_head_screen(151936, 1024, 1);
    check_lm_head_screen(151936, 2048, 2); /* Qwen3-1.7B: two steps per task */
    check_lm_head_screen(1000, 1024, 3);
    check_lm_head_screen(1000, 1024, 4);
    check_lm_head_screen(4099, 2560, 1); /* Qwen3-4B's hidden size, a last step of part chunks */
    check_lm_head_screen(997, 1040, 0);  /* 65 chunks of 16 */
    check_lm_head_screen(3, 4096, 1);    /* fewer rows than a task's warp; 48 KB of dynamic shared memory */
    check_lm_head_screen(500, 6144, 2);  /* the exact pass at 48 KB too */
}

/* ---- batched decode: attention over B sequences, products of B rows ------------------------------- */

/* The split-K kernel with n_splits (bulk_cluster 0), or the bulk-fed cluster kernel with clusters of
 * bulk_cluster blocks, against the reference: output and the cache after the appends. */
static void check_attention_decode_rows(int n_heads, int n_kv, int bs, int n_seqs, const int *ctx, int n_splits,
                                        int out_bf16, int bulk_cluster) {
    const int D = 128, half = 64;
    int max_ctx = 0, total_blocks = 0;
    int32_t *table_start = xmalloc((size_t)n_seqs * 4), *ctx32 = xmalloc((size_t)n_seqs * 4);
    for (int s = 0; s < n_seqs; s++) {
        table_start[s] = total_blocks;
        total_blocks += KITE_TEST_CEIL(ctx[s], bs);
        ctx32[s] = ctx[s];
        if (ctx[s] > max_ctx) max_ctx = ctx[s];
    }
    const int n_blocks = total_blocks + 2, positions = max_ctx + 1;
    paged_cache c = make_cache(n_blocks, bs, n_kv);
    int32_t *tables = xmalloc((size_t)n_blocks * 4);
    make_tables(tables, 1, n_blocks, n_blocks); /* a permutation: every sequence's blocks distinct, scattered */
    const size_t qn = (size_t)n_heads * D, width = (size_t)(n_heads + 2 * n_kv) * D;
    float *qkv = xmalloc((size_t)n_seqs * width * 4), *q = xmalloc(qn * 4), *out = xmalloc((size_t)n_seqs * qn * 4);
    double *ref = xmalloc((size_t)n_seqs * qn * 8), row[128];
    random_f32(qkv, (size_t)n_seqs * width, 1.0f);
    float qn_w[128], kn_w[128];
    for (int i = 0; i < D; i++) {
        qn_w[i] = 1.0f + 0.1f * rng_normal();
        kn_w[i] = 1.0f + 0.1f * rng_normal();
    }
    float *cos_t = xmalloc((size_t)positions * half * 4), *sin_t = xmalloc((size_t)positions * half * 4);
    rope_tables(cos_t, sin_t, positions, D, 1000000.0);
    for (int s = 0; s < n_seqs; s++) { /* each sequence's new K / V into the host copy first */
        const float *src = qkv + (size_t)s * width;
        const int32_t *table = tables + table_start[s];
        const int position = ctx[s] - 1, blk = table[position / bs], slot = position % bs;
        for (int h = 0; h < n_kv; h++) {
            norm_rope_ref(src + (size_t)(n_heads + h) * D, kn_w, cos_t, sin_t, position, row);
            for (int i = 0; i < D; i++) {
                c.bits[kv_index(blk, 0, h, slot, n_kv, bs, D) + i] = float_to_bf16((float)row[i]);
                c.bits[kv_index(blk, 1, h, slot, n_kv, bs, D) + i] = float_to_bf16(src[(size_t)(n_heads + n_kv + h) * D + i]);
            }
        }
    }
    for (int s = 0; s < n_seqs; s++) {
        const float *src = qkv + (size_t)s * width;
        for (int h = 0; h < n_heads; h++) {
            norm_rope_ref(src + (size_t)h * D, qn_w, cos_t, sin_t, ctx[s] - 1, row);
            for (int i = 0; i < D; i++) q[h * D + i] = (float)row[i];
        }
        attention_ref(&c, tables + table_start[s], q, n_heads, ctx[s] - 1, ref + (size_t)s * qn);
    }
    const size_t out_bytes = (size_t)n_seqs * qn * (out_bf16 ? 2 : 4);
    float *d_qkv = device_buffer((size_t)n_seqs * width * 4, qkv);
    void *d_out = device_buffer(out_bytes, NULL);
    int32_t *d_tables = device_buffer((size_t)n_blocks * 4, tables);
    int32_t *d_start = device_buffer((size_t)n_seqs * 4, table_start), *d_ctx = device_buffer((size_t)n_seqs * 4, ctx32);
    float *d_qn = device_buffer(sizeof qn_w, qn_w), *d_kn = device_buffer(sizeof kn_w, kn_w);
    float *d_cos = device_buffer((size_t)positions * half * 4, cos_t), *d_sin = device_buffer((size_t)positions * half * 4, sin_t);
    const size_t ws_bytes = (size_t)n_seqs * cuda_attention_decode_workspace(n_heads, D, n_splits);
    void *d_ws = device_buffer(ws_bytes, NULL);
    const size_t n_counters = (size_t)n_seqs * n_heads;
    unsigned *d_counters = device_buffer(n_counters * 4, NULL);
    DEVICE_CHECK(kite_cuda_memset(d_counters, 0, n_counters * 4));
    cuda_kv_layer kv = {c.device, bs, n_kv, D, c.n_blocks, KITE_KV_CACHE_BF16};
    for (int run = 0; run < 2; run++) { /* twice: the counters must come back to zero */
        DEVICE_CHECK(kite_cuda_memset(d_out, POISON, out_bytes));
        if (bulk_cluster)
            DEVICE_CHECK(cuda_attention_decode_bulk_rows(d_qkv, d_out, out_bf16, kv, d_tables, d_start, d_ctx, d_qn, d_kn,
                                                         d_cos, d_sin, 1e-6f, n_heads, 1.0f / sqrtf((float)D), n_seqs,
                                                         bulk_cluster, NULL, run));
        else
            DEVICE_CHECK(cuda_attention_decode_rows(d_qkv, d_out, out_bf16, kv, d_tables, d_start, d_ctx, d_qn, d_kn,
                                                    d_cos, d_sin, 1e-6f, n_heads, 1.0f / sqrtf((float)D), n_seqs,
                                                    n_splits, d_ws, d_counters, NULL, run));
        if (out_bf16) {
            uint16_t *bits = xmalloc((size_t)n_seqs * qn * 2);
            DEVICE_CHECK(kite_cuda_copy_to_host(bits, d_out, (size_t)n_seqs * qn * 2));
            bf16_to_floats(bits, out, (size_t)n_seqs * qn);
            free(bits);
        } else {
            DEVICE_CHECK(kite_cuda_copy_to_host(out, d_out, (size_t)n_seqs * qn * 4));
        }
        const double e = nmse(out, ref, (size_t)n_seqs * qn);
        CHECK_MSG(e < (out_bf16 ? NMSE_BF16_OUT : 1e-8),
                  "batched decode attention heads %d/%d seqs %d splits %d bulk cluster %d bf16 %d run %d: nmse %g", n_heads,
                  n_kv, n_seqs, n_splits, bulk_cluster, out_bf16, run, e);
    }
    const size_t cache_n = (size_t)n_blocks * 2 * n_kv * bs * D;
    uint16_t *got = xmalloc(cache_n * 2);
    DEVICE_CHECK(kite_cuda_copy_to_host(got, c.device, cache_n * 2));
    size_t differ = 0;
    for (size_t i = 0; i < cache_n; i++) {
        const float a = bf16_to_float(got[i]), b = bf16_to_float(c.bits[i]);
        if (fabsf(a - b) > 1e-2f * fabsf(b) + 1e-6f) differ++;
    }
    CHECK_MSG(differ == 0, "%zu cache elements differ from the reference after the appends", differ);
    unsigned *counters = xmalloc(n_counters * 4);
    DEVICE_CHECK(kite_cuda_copy_to_host(counters, d_counters, n_counters * 4));
    size_t nonzero = 0;
    for (size_t i = 0; i < n_counters; i++) nonzero += counters[i] != 0;
    CHECK_MSG(nonzero == 0, "%zu counters left non-zero", nonzero);
    CHECK(guard_intact(d_out, out_bytes));
    CHECK(guard_intact(c.device, cache_n * 2));
    void *bufs[] = {d_qkv, d_out, d_tables, d_start, d_ctx, d_qn, d_kn, d_cos, d_sin, d_ws, d_counters, c.device};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kite_cuda_free(bufs[i]);
    free(c.bits);
    free(tables);
    free(table_start);
    free(ctx32);
    free(qkv);
    free(q);
    free(out);
    free(ref);
    free(cos_t);
    free(sin_t);
    free(got);
    free(counters);
}

static void test_attention_decode_rows(void) {
    const int ctx_a[3] = {1, 300, 37};
    check_attention_decode_rows(16, 8, 16, 3, ctx_a, 8, 0, 0);
    check_attention_decode_rows(16, 8, 16, 3, ctx_a, 1, 1, 0);
    const int ctx_b[8] = {256, 257, 300, 16, 17, 1000, 2, 333};
    check_attention_decode_rows(16, 8, 16, 8, ctx_b, 8, 0, 0);
    check_attention_decode_rows(8, 2, 32, 8, ctx_b, 3, 1, 0); /* group of 4 */
    int ctx_c[33];
    for (int s = 0; s < 33; s++) ctx_c[s] = 1 + (int)(rng_next() % 700);
    check_attention_decode_rows(16, 8, 16, 33, ctx_c, 2, 1, 0);
}

/* The bulk-fed cluster kernel over B sequences: clusters of 1 .. 16 blocks (ranges longer than the producer's
 * 32-entry window of the block table at cluster 1), groups of 1, 2 and 4 heads, both outputs, and its size query. */
static void test_attention_decode_bulk_rows(void) {
    const int ctx_a[3] = {1, 300, 37};
    check_attention_decode_rows(16, 8, 16, 3, ctx_a, 0, 1, 16);
    check_attention_decode_rows(16, 8, 16, 3, ctx_a, 0, 0, 8);
    const int ctx_b[8] = {256, 257, 300, 16, 17, 1000, 2, 333};
    check_attention_decode_rows(16, 8, 16, 8, ctx_b, 0, 1, 4);
    check_attention_decode_rows(16, 8, 16, 8, ctx_b, 0, 0, 1);
    check_attention_decode_rows(8, 2, 32, 8, ctx_b, 0, 1, 2); /* group of 4 */
    check_attention_decode_rows(6, 6, 8, 8, ctx_b, 0, 1, 1);  /* group of 1, blocks of 8 positions */
    int ctx_c[33];
    for (int s = 0; s < 33; s++) ctx_c[s] = 1 + (int)(rng_next() % 2500);
    check_attention_decode_rows(16, 8, 16, 33, ctx_c, 0, 1, 1);
    check_attention_decode_rows(16, 8, 16, 33, ctx_c, 0, 1, 2);
    const cuda_kv_layer shape = {NULL, 16, 8, 128, 0, KITE_KV_CACHE_BF16};
    const int size8 = cuda_attention_decode_bulk_rows_size(16, shape, 8);
    CHECK_MSG(size8 >= 1 && size8 <= 16 && (size8 & (size8 - 1)) == 0, "bulk rows cluster size for 8 sequences: %d", size8);
    CHECK_MSG(cuda_attention_decode_bulk_rows_size(16, shape, 16) <= size8, "more sequences, larger clusters");
}

/* x_bf16: the input uploaded as bf16 (ADD or ARGMAX without a norm); y_bf16: the output stored as bf16 (SWIGLU). */
static void check_gemm_rows_io(int n_rows, int rows, int cols, int epilogue, int with_norm, int x_bf16, int y_bf16) {
    const size_t wn = (size_t)rows * cols, xn = (size_t)n_rows * cols;
    const int outputs = epilogue == CUDA_GEMV_SWIGLU ? rows / 2 : rows;
    const size_t yn = (size_t)n_rows * outputs;
    uint16_t *w_bits = xmalloc(wn * 2);
    float *w = xmalloc(wn * 4), *x = xmalloc(xn * 4), *g = xmalloc((size_t)cols * 4);
    random_bf16(w_bits, w, wn, 0.05f);
    random_f32(x, xn, 1.0f);
    for (int i = 0; i < cols; i++) g[i] = 1.0f + 0.1f * rng_normal();
    float *y0 = xmalloc(yn * 4), *y = xmalloc(yn * 4);
    double *ref = xmalloc(yn * 8), *dots = xmalloc((size_t)rows * 8);
    float *in = xmalloc((size_t)cols * 4);
    random_f32(y0, yn, 1.0f);
    for (int b = 0; b < n_rows; b++) {
        const float *xb = x + (size_t)b * cols;
        double ss = 0;
        for (int i = 0; i < cols; i++) ss += (double)xb[i] * xb[i];
        const float s = with_norm ? (float)(1.0 / sqrt(ss / cols + 1e-6)) : 1.0f;
        for (int i = 0; i < cols; i++) /* the kernel rounds its input to bf16 */
            in[i] = bf16_to_float(float_to_bf16(with_norm ? xb[i] * s * g[i] : xb[i]));
        for (int r = 0; r < rows; r++) {
            double acc = 0;
            for (int i = 0; i < cols; i++) acc += (double)w[(size_t)r * cols + i] * in[i];
            dots[r] = acc;
        }
        for (int o = 0; o < outputs; o++) {
            double v = dots[o];
            if (epilogue == CUDA_GEMV_SWIGLU) v = dots[o] / (1.0 + exp(-dots[o])) * dots[o + outputs];
            else if (epilogue == CUDA_GEMV_ADD || epilogue == CUDA_GEMV_ADD_SETTLED) v += y0[(size_t)b * outputs + o];
            ref[(size_t)b * outputs + o] = v;
        }
    }
    uint16_t *x_bits = xmalloc(xn * 2);
    for (size_t i = 0; i < xn; i++) x_bits[i] = float_to_bf16(x[i]);
    void *d_w = device_buffer(wn * 2, w_bits);
    void *d_x = x_bf16 ? device_buffer(xn * 2, x_bits) : device_buffer(xn * 4, x);
    float *d_g = device_buffer((size_t)cols * 4, g);
    const size_t y_bytes = yn * (y_bf16 ? 2 : 4);
    void *d_y = device_buffer(y_bytes, epilogue == CUDA_GEMV_ADD || epilogue == CUDA_GEMV_ADD_SETTLED ? y0 : NULL);
    void *d_ws = device_buffer(cuda_gemm_rows_argmax_workspace(), NULL);
    int32_t *d_ids = device_buffer((size_t)n_rows * 4, NULL);
    DEVICE_CHECK(cuda_gemm_rows(d_w, d_x, x_bf16, with_norm ? d_g : NULL, 1e-6f, d_y, y_bf16, n_rows, rows, cols, epilogue,
                                d_ws, d_ids, NULL, 1));
    if (y_bf16) {
        uint16_t *bits = xmalloc(yn * 2);
        DEVICE_CHECK(kite_cuda_copy_to_host(bits, d_y, yn * 2));
        bf16_to_floats(bits, y, yn);
        free(bits);
    } else {
        DEVICE_CHECK(kite_cuda_copy_to_host(y, d_y, yn * 4));
    }
    /* Near-ties in the bf16 rounding of the input aside, products agree to fp32 accumulation (a bf16 output:
     * to its rounding). */
    const double e = nmse(y, ref, yn);
    CHECK_MSG(e < (y_bf16 ? NMSE_BF16_OUT : 1e-7), "gemm_rows %d x %d x %d epilogue %d norm %d bf16 in %d out %d: nmse %g",
              n_rows, rows, cols, epilogue, with_norm, x_bf16, y_bf16, e);
    CHECK(guard_intact(d_y, y_bytes));
    if (epilogue == CUDA_GEMV_ARGMAX) {
        int32_t ids[32];
        DEVICE_CHECK(kite_cuda_copy_to_host(ids, d_ids, (size_t)n_rows * 4));
        for (int b = 0; b < n_rows; b++) {
            const float *yb = y + (size_t)b * outputs;
            int best = 0;
            for (int r = 1; r < rows; r++)
                if (yb[r] > yb[best]) best = r;
            CHECK_MSG(ids[b] == best, "gemm_rows argmax row %d: %d, expected %d", b, ids[b], best);
        }
        CHECK(guard_intact(d_ids, (size_t)n_rows * 4));
    }
    void *bufs[] = {d_w, d_x, d_g, d_y, d_ws, d_ids};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kite_cuda_free(bufs[i]);
    free(w_bits);
    free(x_bits);
    free(w);
    free(x);
    free(g);
    free(y0);
    free(y);
    free(ref);
    free(dots);
    free(in);
}

static void check_gemm_rows(int n_rows, int rows, int cols, int epilogue, int with_norm) {
    check_gemm_rows_io(n_rows, rows, cols, epilogue, with_norm, 0, 0);
}

static void test_gemm_rows(void) {
    check_gemm_rows(8, 4096, 1024, CUDA_GEMV_STORE, 1);
    check_gemm_rows(3, 1000, 1024, CUDA_GEMV_STORE, 1);
    check_gemm_rows(16, 1000, 520, CUDA_GEMV_STORE, 0);
    check_gemm_rows(1, 999, 72, CUDA_GEMV_STORE, 0);
    check_gemm_rows(13, 1024, 2048, CUDA_GEMV_ADD, 0);
    check_gemm_rows(5, 1000, 3072, CUDA_GEMV_ADD, 0);
    check_gemm_rows(8, 6144, 1024, CUDA_GEMV_SWIGLU, 1);
    check_gemm_rows(11, 1002, 2056, CUDA_GEMV_SWIGLU, 1);
    check_gemm_rows(4, 151936, 1024, CUDA_GEMV_ARGMAX, 1);
    check_gemm_rows(16, 999, 2048, CUDA_GEMV_ARGMAX, 1);
    check_gemm_rows(2, 30, 1024, CUDA_GEMV_ARGMAX, 1);
    check_gemm_rows(32, 4096, 1024, CUDA_GEMV_STORE, 1);
    check_gemm_rows(27, 1000, 3072, CUDA_GEMV_ADD, 0);
    check_gemm_rows(17, 1002, 2056, CUDA_GEMV_SWIGLU, 1);
    check_gemm_rows(32, 151936, 1024, CUDA_GEMV_ARGMAX, 1);
    check_gemm_rows(21, 999, 2048, CUDA_GEMV_ARGMAX, 1);
    /* Up to 8 fp32 rows are staged raw in shared memory where two blocks per SM fit (1,024 and 2,048 columns
     * above and here), through registers where not (2,560 columns with a norm, 3,072 above). */
    check_gemm_rows(7, 2000, 2048, CUDA_GEMV_SWIGLU, 1);
    check_gemm_rows(6, 1000, 2560, CUDA_GEMV_STORE, 1);
    /* The batched path's bf16 activations: o_proj / down inputs, the SwiGLU output. */
    check_gemm_rows_io(8, 1024, 2048, CUDA_GEMV_ADD, 0, 1, 0);
    check_gemm_rows_io(5, 1000, 3072, CUDA_GEMV_ADD, 0, 1, 0);
    check_gemm_rows_io(27, 1000, 3072, CUDA_GEMV_ADD, 0, 1, 0);
    check_gemm_rows_io(1, 999, 72, CUDA_GEMV_ADD, 0, 1, 0);
    /* ADD_SETTLED (old outputs of a block's first iteration read before the PDL wait): one output per thread
     * (8 rows), more than SETTLED_PER_THREAD (27 rows, 20,000 outputs), fp32 input, several iterations. */
    check_gemm_rows_io(8, 1024, 2048, CUDA_GEMV_ADD_SETTLED, 0, 1, 0);
    check_gemm_rows_io(5, 1000, 3072, CUDA_GEMV_ADD_SETTLED, 0, 1, 0);
    check_gemm_rows_io(16, 1000, 3072, CUDA_GEMV_ADD_SETTLED, 0, 1, 0);
    check_gemm_rows_io(27, 20000, 1024, CUDA_GEMV_ADD_SETTLED, 0, 0, 0);
    check_gemm_rows_io(9, 80000, 72, CUDA_GEMV_ADD_SETTLED, 0, 0, 0); /* several iterations per block */
    check_gemm_rows_io(8, 6144, 1024, CUDA_GEMV_SWIGLU, 1, 0, 1);
    check_gemm_rows_io(17, 1002, 2056, CUDA_GEMV_SWIGLU, 1, 0, 1);
    /* The lm_head after the split products' fused norm: bf16 input, no norm, at each n-tile count. */
    check_gemm_rows_io(32, 151936, 1024, CUDA_GEMV_ARGMAX, 0, 1, 0);
    check_gemm_rows_io(13, 999, 2048, CUDA_GEMV_ARGMAX, 0, 1, 0);
    check_gemm_rows_io(3, 30, 72, CUDA_GEMV_ARGMAX, 0, 1, 0);
    /* What fits shared memory: 32 rows of 3,072 columns do, of 6,144 not (refused, not run). */
    CHECK(cuda_gemm_rows_fits(32, 3072) && !cuda_gemm_rows_fits(32, 6144) && cuda_gemm_rows_fits(16, 6144));
    CHECK(!cuda_gemm_rows_fits(0, 64) && !cuda_gemm_rows_fits(33, 64));
    CHECK(cuda_gemm_rows(NULL, NULL, 0, NULL, 0.0f, NULL, 0, 32, 64, 6144, CUDA_GEMV_STORE, NULL, NULL, NULL, 0) ==
          KITE_ERROR_UNSUPPORTED);
    /* Combinations the kernels do not implement are refused, not run. */
    CHECK(cuda_gemm_rows(NULL, NULL, 1, (const float *)16, 1e-6f, NULL, 0, 8, 64, 64, CUDA_GEMV_ADD, NULL, NULL, NULL, 0) ==
          KITE_ERROR_UNSUPPORTED);
    CHECK(cuda_gemm_rows(NULL, NULL, 0, NULL, 0.0f, NULL, 1, 8, 64, 64, CUDA_GEMV_ADD, NULL, NULL, NULL, 0) ==
          KITE_ERROR_UNSUPPORTED);
    CHECK(cuda_gemm_rows(NULL, NULL, 1, NULL, 0.0f, NULL, 0, 8, 64, 64, CUDA_GEMV_STORE, NULL, NULL, NULL, 0) ==
          KITE_ERROR_UNSUPPORTED);
}

/* vocab % 4 == 0 takes the kernel's 16-byte loads, other sizes its scalar loop. */
static void check_argmax_rows(int vocab) {
    const int rows = 4;
    float *logits = xmalloc((size_t)rows * vocab * 4);
    random_f32(logits, (size_t)rows * vocab, 1.0f);
    logits[77] = 50.0f;
    logits[vocab - 5] = 50.0f; /* tie: the lowest id wins */
    logits[(size_t)vocab + vocab - 1] = 60.0f;
    logits[2 * (size_t)vocab + 3] = NAN; /* a NaN allows no token: -1 (ARGMAX_NO_TOKEN), whatever the rest holds */
    logits[2 * (size_t)vocab + 100] = 40.0f;
    for (int i = 0; i < vocab; i++) logits[3 * (size_t)vocab + i] = -INFINITY; /* no finite logit: -1 */
    float *d_logits = device_buffer((size_t)rows * vocab * 4, logits);
    int32_t *d_ids = device_buffer(rows * 4, NULL);
    DEVICE_CHECK(cuda_argmax_rows(d_logits, d_ids, rows, vocab, NULL));
    int32_t ids[4];
    DEVICE_CHECK(kite_cuda_copy_to_host(ids, d_ids, sizeof ids));
    CHECK_MSG(ids[0] == 77 && ids[1] == vocab - 1 && ids[2] == -1 && ids[3] == -1, "argmax (vocab %d) %d %d %d %d", vocab,
              ids[0], ids[1], ids[2], ids[3]);
    CHECK(guard_intact(d_ids, rows * 4));
    kite_cuda_free(d_logits);
    kite_cuda_free(d_ids);
    free(logits);
}

/* cuda_publish_ids: the ids land in slot (parity & 1) of the ring; the other slot is untouched. */
static void test_publish_ids(void) {
    enum { N = 37 };
    int32_t ids[N], ring[2 * N];
    for (int i = 0; i < N; i++) ids[i] = 1000 + 3 * i;
    void *d_ids = device_buffer(sizeof ids, ids);
    for (int32_t parity = 6; parity <= 7; parity++) {
        void *d_parity = device_buffer(sizeof parity, &parity);
        int32_t *d_ring = device_buffer(sizeof ring, NULL);
        DEVICE_CHECK(kite_cuda_memset(d_ring, 0xff, sizeof ring));
        DEVICE_CHECK(cuda_publish_ids(d_ids, N, d_parity, d_ring, NULL, 0));
        DEVICE_CHECK(kite_cuda_copy_to_host(ring, d_ring, sizeof ring));
        int bad = 0;
        for (int i = 0; i < 2 * N; i++) {
            const int32_t want = i / N == (parity & 1) ? ids[i % N] : -1;
            bad += ring[i] != want;
        }
        CHECK_MSG(bad == 0, "parity %d: %d ring entries wrong", parity, bad);
        CHECK(guard_intact(d_ring, sizeof ring));
        kite_cuda_free(d_parity);
        kite_cuda_free(d_ring);
    }
    CHECK(cuda_publish_ids(d_ids, 0, d_ids, d_ids, NULL, 0) == KITE_ERROR_INVALID_ARGUMENT);
    kite_cuda_free(d_ids);
}

/* cuda_publish_and_advance: the id into the ring slot of the step's position, then position, context and slot moved
 * on by one; a slot whose block is past the table's entries is left as it was. */
static void test_publish_and_advance(void) {
    enum { BS = 16, ENTRIES = 3 };
    const int32_t id = 4242, table[ENTRIES] = {7, 2, 9};
    void *d_id = device_buffer(sizeof id, &id);
    int32_t *d_table = device_buffer(sizeof table, table);
    const int32_t positions[] = {5, 14, 15, 31, 47}; /* within a block, two block ends, the last entry's end */
    for (int i = 0; i < (int)(sizeof positions / sizeof positions[0]); i++) {
        const int32_t p = positions[i], old_slot = -5;
        int32_t values[3] = {p, old_slot, p + 1}; /* position, slot, context */
        int32_t *d_values = device_buffer(sizeof values, values);
        int32_t *d_ring = device_buffer(2 * sizeof(int32_t), NULL);
        DEVICE_CHECK(kite_cuda_memset(d_ring, 0xff, 2 * sizeof(int32_t)));
        const cuda_decode_step step = {d_values, d_values + 1, d_values + 2, d_table, BS, ENTRIES};
        DEVICE_CHECK(cuda_publish_and_advance(d_id, step, d_ring, NULL, 0));
        int32_t ring[2];
        DEVICE_CHECK(kite_cuda_copy_to_host(ring, d_ring, sizeof ring));
        DEVICE_CHECK(kite_cuda_copy_to_host(values, d_values, sizeof values));
        const int32_t next = p + 1;
        const int32_t want_slot = next / BS < ENTRIES ? table[next / BS] * BS + next % BS : old_slot;
        CHECK_MSG(ring[p & 1] == id && ring[(p & 1) ^ 1] == -1, "position %d: ring %d %d", p, ring[0], ring[1]);
        CHECK_MSG(values[0] == next && values[2] == next + 1 && values[1] == want_slot,
                  "position %d: advanced to position %d slot %d context %d, want %d %d %d", p, values[0], values[1],
                  values[2], next, want_slot, next + 1);
        CHECK(guard_intact(d_ring, 2 * sizeof(int32_t)));
        CHECK(guard_intact(d_values, sizeof values));
        kite_cuda_free(d_values);
        kite_cuda_free(d_ring);
    }
    const cuda_decode_step bad = {NULL, NULL, NULL, d_table, BS, ENTRIES};
    CHECK(cuda_publish_and_advance(d_id, bad, d_table, NULL, 0) == KITE_ERROR_INVALID_ARGUMENT);
    kite_cuda_free(d_id);
    kite_cuda_free(d_table);
}

static void test_argmax_rows(void) {
    check_argmax_rows(151936);
    check_argmax_rows(1003);
}

/* cuda_top_candidates against a sort on the host. */
static const float *top_sort_logits;
static int compare_top(const void *a, const void *b) {
    const int x = *(const int *)a, y = *(const int *)b;
    if (top_sort_logits[x] != top_sort_logits[y]) return top_sort_logits[x] > top_sort_logits[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Row r of `logits` (vocab wide) checked: n, max, finite count, log-sum-exp and the k best in order; a row
 * with a NaN / +inf reports the first. */
static void check_top_row(const float *row, int vocab, int k, const float *top_logits, const int32_t *top_ids,
                          const cuda_row_top *st, int r, int *order) {
    int n_finite = 0, bad = -1;
    float max_logit = -INFINITY;
    for (int i = 0; i < vocab; i++) {
        if (isnan(row[i]) || row[i] == INFINITY) {
            if (bad < 0) bad = i;
        } else if (row[i] != -INFINITY) {
            order[n_finite++] = i;
            if (row[i] > max_logit) max_logit = row[i];
        }
    }
    if (bad >= 0 || n_finite == 0) {
        CHECK_MSG(st->n == 0 && st->bad_index == bad && st->n_finite == n_finite, "row %d: n %d bad %d (expected %d) finite %d",
                  r, st->n, st->bad_index, bad, st->n_finite);
        return;
    }
    CHECK_MSG(st->max_logit == max_logit && st->n_finite == n_finite && st->bad_index == -1,
              "row %d: max %g (expected %g), finite %d (expected %d)", r, st->max_logit, max_logit, st->n_finite, n_finite);
    double sum = 0.0;
    for (int i = 0; i < vocab; i++) sum += (double)expf(row[i] - max_logit);
    CHECK_MSG(fabs(st->log_sum_exp - log(sum)) < 1e-6, "row %d: log-sum-exp %.9g vs %.9g", r, st->log_sum_exp, log(sum));
    top_sort_logits = row;
    qsort(order, (size_t)n_finite, sizeof *order, compare_top);
    const int want = n_finite < k ? n_finite : k;
    CHECK_MSG(st->n == want, "row %d: %d candidates, expected %d", r, st->n, want);
    for (int i = 0; i < want && i < st->n; i++)
        CHECK_MSG(top_ids[i] == order[i] && top_logits[i] == row[order[i]], "row %d candidate %d: id %d (%g), expected %d (%g)",
                  r, i, top_ids[i], top_logits[i], order[i], row[order[i]]);
}

static void test_top_candidates(void) {
    const int vocab = 151936, rows = 6, k = 64;
    float *logits = xmalloc((size_t)rows * vocab * 4);
    int *order = xmalloc((size_t)vocab * sizeof(int));
    random_f32(logits, (size_t)rows * vocab, 3.0f);
    float *r0 = logits, *r1 = logits + vocab, *r2 = logits + 2 * (size_t)vocab, *r3 = logits + 3 * (size_t)vocab;
    float *r4 = logits + 4 * (size_t)vocab, *r5 = logits + 5 * (size_t)vocab;
    for (int i = 0; i < 40; i++) r0[1000 + 97 * i] = 9.0f;   /* ties at the top, across the cut */
    for (int i = 0; i < 3000; i++) r0[(size_t)(i * 50)] = -INFINITY;
    r1[500] = NAN;                                              /* the first bad logit is reported */
    r1[900] = INFINITY;
    r1[150000] = NAN; /* a later slice's */
    for (int i = 0; i < vocab; i++) r2[i] = -INFINITY;          /* nothing finite */
    for (int i = 0; i < vocab; i++) r3[i] = i % 30 == 0 ? 50.0f : r3[i]; /* 5,065 tied at the top (above any N(0, 9) draw) */
    for (int i = 0; i < vocab; i++) r4[i] = i < 10 ? (float)i : -INFINITY; /* fewer finite than k */
    for (int i = 0; i < vocab; i++) r5[i] = -0.01f * (float)(i % 4096); /* 38-way ties, one in each slice of 4,096 */
    float *d_logits = device_buffer((size_t)rows * vocab * 4, logits);
    float *d_top = device_buffer((size_t)rows * k * 4, NULL);
    int32_t *d_ids = device_buffer((size_t)rows * k * 4, NULL);
    cuda_row_top *d_stats = device_buffer(rows * sizeof(cuda_row_top), NULL);
    void *d_ws = device_buffer(cuda_top_candidates_workspace(rows, vocab), NULL);
    DEVICE_CHECK(cuda_top_candidates(d_logits, rows, vocab, k, d_top, d_ids, d_stats, d_ws, NULL));
    float *top = xmalloc((size_t)rows * k * 4);
    int32_t *ids = xmalloc((size_t)rows * k * 4);
    cuda_row_top stats[6];
    DEVICE_CHECK(kite_cuda_copy_to_host(top, d_top, (size_t)rows * k * 4));
    DEVICE_CHECK(kite_cuda_copy_to_host(ids, d_ids, (size_t)rows * k * 4));
    DEVICE_CHECK(kite_cuda_copy_to_host(stats, d_stats, sizeof stats));
    for (int r = 0; r < rows; r++)
        check_top_row(logits + (size_t)r * vocab, vocab, k, top + (size_t)r * k, ids + (size_t)r * k, &stats[r], r, order);
    CHECK_MSG(stats[3].n == k, "row 3 (5,065 ties at the top): n %d, expected %d", stats[3].n, k);
    CHECK(guard_intact(d_stats, rows * sizeof(cuda_row_top)));
    /* k = 1 and a vocabulary that is not a multiple of anything */
    DEVICE_CHECK(cuda_top_candidates(d_logits, 1, 1003, 1, d_top, d_ids, d_stats, d_ws, NULL));
    DEVICE_CHECK(kite_cuda_copy_to_host(top, d_top, 4));
    DEVICE_CHECK(kite_cuda_copy_to_host(ids, d_ids, 4));
    DEVICE_CHECK(kite_cuda_copy_to_host(stats, d_stats, sizeof stats[0]));
    check_top_row(logits, 1003, 1, top, ids, &stats[0], 100, order);
    CHECK(cuda_top_candidates(d_logits, 1, vocab, CUDA_TOP_MAX + 1, d_top, d_ids, d_stats, d_ws, NULL) ==
          KITE_ERROR_INVALID_ARGUMENT);
    /* What the merge holds: 64 slices, 3,072 candidates; beyond, refused (read_top reports n = -1). */
    CHECK(cuda_top_candidates_fits(151936, 64) && cuda_top_candidates_fits(196608, 64) &&
          !cuda_top_candidates_fits(200000, 64) && cuda_top_candidates_fits(200000, 40) &&
          !cuda_top_candidates_fits(300000, 1));
    CHECK(cuda_top_candidates(d_logits, 1, 200000, 64, d_top, d_ids, d_stats, d_ws, NULL) == KITE_ERROR_UNSUPPORTED);
    void *bufs[] = {d_logits, d_top, d_ids, d_stats, d_ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kite_cuda_free(bufs[i]);
    free(logits);
    free(order);
    free(top);
    free(ids);
}

static void check_gemm(cuda_gemm *gemm, int n, int m, int k, int out_f32, float beta) {
    const size_t xn = (size_t)n * k, wn = (size_t)m * k, yn = (size_t)n * m;
    uint16_t *x_bits = xmalloc(xn * 2), *w_bits = xmalloc(wn * 2), *y_bits = xmalloc(yn * 2);
    float *x = xmalloc(xn * 4), *w = xmalloc(wn * 4), *y0 = xmalloc(yn * 4), *y = xmalloc(yn * 4);
    double *ref = xmalloc(yn * 8);
    random_bf16(x_bits, x, xn, 1.0f);
    random_bf16(w_bits, w, wn, 0.05f);
    random_f32(y0, yn, 1.0f);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double acc = 0;
            for (int l = 0; l < k; l++) acc += (double)x[(size_t)i * k + l] * w[(size_t)j * k + l];
            ref[(size_t)i * m + j] = acc + (beta != 0.0f ? (double)beta * y0[(size_t)i * m + j] : 0.0);
        }
    void *d_x = device_buffer(xn * 2, x_bits), *d_w = device_buffer(wn * 2, w_bits);
    void *d_y = device_buffer(yn * (out_f32 ? 4 : 2), beta != 0.0f ? y0 : NULL);
    DEVICE_CHECK(cuda_gemm_bf16(gemm, d_x, d_w, d_y, out_f32, beta, n, m, k, NULL));
    if (out_f32) {
        DEVICE_CHECK(kite_cuda_copy_to_host(y, d_y, yn * 4));
    } else {
        DEVICE_CHECK(kite_cuda_copy_to_host(y_bits, d_y, yn * 2));
        bf16_to_floats(y_bits, y, yn);
    }
    const double e = nmse(y, ref, yn);
    CHECK_MSG(e < (out_f32 ? 1e-8 : NMSE_BF16_OUT), "gemm %d x %d x %d out_f32 %d beta %g: nmse %g", n, m, k, out_f32,
              beta, e);
    CHECK(guard_intact(d_y, yn * (out_f32 ? 4 : 2)));
    kite_cuda_free(d_x);
    kite_cuda_free(d_w);
    kite_cuda_free(d_y);
    free(x_bits);
    free(w_bits);
    free(y_bits);
    free(x);
    free(w);
    free(y0);
    free(y);
    free(ref);
}

/* The split product: each slice's partial against its own reference. */
static void check_gemm_split(cuda_gemm *gemm, int n, int m, int k, int slices) {
    const size_t xn = (size_t)n * k, wn = (size_t)m * k, yn = (size_t)n * m;
    const int ks = k / slices;
    uint16_t *x_bits = xmalloc(xn * 2), *w_bits = xmalloc(wn * 2);
    float *x = xmalloc(xn * 4), *w = xmalloc(wn * 4), *y = xmalloc(yn * slices * 4);
    double *ref = xmalloc(yn * slices * 8);
    random_bf16(x_bits, x, xn, 1.0f);
    random_bf16(w_bits, w, wn, 0.05f);
    for (int s = 0; s < slices; s++)
        for (int i = 0; i < n; i++)
            for (int j = 0; j < m; j++) {
                double acc = 0;
                for (int l = s * ks; l < (s + 1) * ks; l++) acc += (double)x[(size_t)i * k + l] * w[(size_t)j * k + l];
                ref[(size_t)s * yn + (size_t)i * m + j] = acc;
            }
    void *d_x = device_buffer(xn * 2, x_bits), *d_w = device_buffer(wn * 2, w_bits);
    float *d_y = device_buffer(yn * slices * 4, NULL);
    DEVICE_CHECK(cuda_gemm_bf16_split(gemm, d_x, d_w, d_y, slices, n, m, k, NULL));
    DEVICE_CHECK(kite_cuda_copy_to_host(y, d_y, yn * slices * 4));
    for (int s = 0; s < slices; s++) {
        const double e = nmse(y + (size_t)s * yn, ref + (size_t)s * yn, yn);
        CHECK_MSG(e < 1e-8, "gemm split %d x %d x %d slice %d of %d: nmse %g", n, m, k, s, slices, e);
    }
    CHECK(guard_intact(d_y, yn * slices * 4));
    /* Refused: a slice that is not a multiple of 8 columns. */
    CHECK(cuda_gemm_bf16_split(gemm, d_x, d_w, d_y, 5, n, m, k, NULL) == KITE_ERROR_INVALID_ARGUMENT);
    kite_cuda_free(d_x);
    kite_cuda_free(d_w);
    kite_cuda_free(d_y);
    free(x_bits);
    free(w_bits);
    free(x);
    free(w);
    free(y);
    free(ref);
}

static void test_gemm(void) {
    cuda_gemm *gemm = NULL;
    DEVICE_CHECK(cuda_gemm_create(&gemm));
    check_gemm(gemm, 37, 200, 264, 0, 0.0f);
    check_gemm(gemm, 5, 1000, 1024, 1, 1.0f);
    check_gemm(gemm, 300, 1024, 2048, 1, 1.0f);
    check_gemm(gemm, 1, 4096, 1024, 0, 0.0f);
    check_gemm(gemm, 37, 200, 264, 0, 0.0f); /* the cached plan */
    check_gemm_split(gemm, 32, 1024, 3072, 4); /* the batched down projection's shape */
    check_gemm_split(gemm, 13, 200, 512, 2);
    check_gemm(gemm, 32, 1024, 3072, 1, 1.0f); /* the same shape unsplit: a plan of its own */
    cuda_gemm_destroy(gemm);
}

/* The fp8 KV quantization on the device against quant/fp8_kv.h's (the CPU oracle's) bit for bit: random vectors
 * over 40 binades (subnormal codes included), zeros, signed zeros, a vector of float32 subnormals (which
 * --use_fast_math's flush to zero must not touch), and non-finite ones (scale NaN, NaN codes). */
static void test_kv_fp8_quantize(void) {
    const int n = 64, head_dim = 128;
    uint16_t *x = xmalloc((size_t)n * head_dim * 2);
    for (int v = 0; v < n; v++) {
        const float magnitude = ldexpf(1.0f, v % 40 - 20);
        random_bf16(x + (size_t)v * head_dim, NULL, head_dim, magnitude);
    }
    uint16_t *edge = x + (size_t)(n - 6) * head_dim;
    for (int i = 0; i < head_dim; i++) {
        edge[i] = 0x0000;                                     /* zeros */
        edge[head_dim + i] = (i & 1) ? 0x8000 : 0x0000;       /* signed zeros */
        edge[2 * head_dim + i] = (i == 7) ? 0x0001 : 0x0080;  /* bf16 subnormals: a float32-subnormal scale */
        edge[3 * head_dim + i] = (uint16_t)(0x3f80 + i);      /* a plain vector, then a NaN in it */
        edge[4 * head_dim + i] = (uint16_t)(0x3f80 + i);
        edge[5 * head_dim + i] = (uint16_t)(0x3f80 + i);
    }
    edge[4 * head_dim + 100] = 0x7fc0; /* NaN */
    edge[5 * head_dim + 3] = 0xff80;   /* -inf */
    void *d_x = device_buffer((size_t)n * head_dim * 2, x);
    uint8_t *d_codes = device_buffer((size_t)n * head_dim, NULL);
    float *d_scales = device_buffer((size_t)n * 4, NULL);
    DEVICE_CHECK(cuda_kv_fp8_quantize(d_x, d_codes, d_scales, n, head_dim, NULL));
    uint8_t *codes = xmalloc((size_t)n * head_dim), want[128];
    float *scales = xmalloc((size_t)n * 4), values[128];
    DEVICE_CHECK(kite_cuda_copy_to_host(codes, d_codes, (size_t)n * head_dim));
    DEVICE_CHECK(kite_cuda_copy_to_host(scales, d_scales, (size_t)n * 4));
    int bad_codes = 0, bad_scales = 0;
    for (int v = 0; v < n; v++) {
        for (int i = 0; i < head_dim; i++) values[i] = bf16_to_float(x[(size_t)v * head_dim + i]);
        const float scale = fp8_kv_quantize(values, head_dim, want);
        const int same_scale = isnan(scale) ? isnan(scales[v]) : memcmp(&scale, &scales[v], sizeof scale) == 0;
        if (!same_scale) {
            bad_scales++;
            printf("  vector %d: scale %a, host %a\n", v, (double)scales[v], (double)scale);
        }
        for (int i = 0; i < head_dim; i++)
            if (codes[(size_t)v * head_dim + i] != want[i] && bad_codes++ < 8)
                printf("  vector %d element %d (%a): code 0x%02x, host 0x%02x\n", v, i, (double)values[i],
                       codes[(size_t)v * head_dim + i], want[i]);
    }
    CHECK_MSG(bad_codes == 0 && bad_scales == 0, "%d codes and %d scales differ from quant/fp8_kv.c", bad_codes,
              bad_scales);
    CHECK(isnan(scales[n - 2]) && isnan(scales[n - 1]) && scales[n - 6] == 0.0f && scales[n - 5] == 0.0f &&
          scales[n - 4] > 0.0f && scales[n - 4] < 0x1p-126f);
    CHECK(guard_intact(d_codes, (size_t)n * head_dim) && guard_intact(d_scales, (size_t)n * 4));
    CHECK(cuda_kv_fp8_quantize(d_x, d_codes, d_scales, n, 64, NULL) == KITE_ERROR_INVALID_ARGUMENT);
    kite_cuda_free(d_x);
    kite_cuda_free(d_codes);
    kite_cuda_free(d_scales);
    free(x);
    free(codes);
    free(scales);
}

int main(void) {
    require_gpu();
    TEST_RUN(test_kv_fp8_quantize);
    TEST_RUN(test_embed);
    TEST_RUN(test_rmsnorm);
    TEST_RUN(test_residual_rmsnorm);
    TEST_RUN(test_swiglu);
    TEST_RUN(test_qk_norm_rope);
    TEST_RUN(test_attention_prefill);
    TEST_RUN(test_attention_decode);
    TEST_RUN(test_attention_decode_bulk);
    TEST_RUN(test_gemv);
    TEST_RUN(test_lm_head_screen);
    TEST_RUN(test_attention_decode_rows);
    TEST_RUN(test_attention_decode_bulk_rows);
    TEST_RUN(test_gemm_rows);
    TEST_RUN(test_argmax_rows);
    TEST_RUN(test_publish_ids);
    TEST_RUN(test_publish_and_advance);
    TEST_RUN(test_top_candidates);
    TEST_RUN(test_gemm);
    return test_finish();
}

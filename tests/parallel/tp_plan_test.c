/* The tensor-parallel split (src/parallel/tp_plan.h): every dimension covered once, in rank order, and the
 * degrees that do not divide refused with a message naming the field. */
#include <stdio.h>
#include <string.h>

#include "parallel/tp_plan.h"
#include "test_util.h"
#include "util/error.h"

static qwen3_config config_of(int32_t n_heads, int32_t n_kv_heads, int32_t intermediate, int32_t vocab) {
    qwen3_config c;
    memset(&c, 0, sizeof c);
    c.hidden_size = 64;
    c.n_layers = 2;
    c.n_heads = n_heads;
    c.n_kv_heads = n_kv_heads;
    c.head_dim = 16;
    c.intermediate_size = intermediate;
    c.vocab_size = vocab;
    c.max_position_embeddings = 128;
    return c;
}

/* The ranges of one dimension over the ranks: contiguous, in rank order, covering [0, size) once. */
static void check_tiles(const tp_range *ranges, int32_t n_ranks, int32_t size, const char *what) {
    int32_t next = 0;
    for (int32_t r = 0; r < n_ranks; r++) {
        CHECK_MSG(ranges[r].begin == next && ranges[r].count >= 0, "%s: rank %d has [%d, +%d), expected to start at %d",
                  what, (int)r, (int)ranges[r].begin, (int)ranges[r].count, (int)next);
        next = ranges[r].begin + ranges[r].count;
    }
    CHECK_MSG(next == size, "%s: the ranks cover %d of %d", what, (int)next, (int)size);
}

static void test_split_covers_every_dimension(void) {
    const int32_t degrees[] = {1, 2, 4};
    const qwen3_config c = config_of(8, 4, 128, 1001);
    for (size_t d = 0; d < sizeof degrees / sizeof degrees[0]; d++) {
        const int32_t n = degrees[d];
        tp_range q_heads[4], kv_heads[4], q_rows[4], kv_rows[4], inter[4], vocab[4];
        for (int32_t r = 0; r < n; r++) {
            tp_plan p;
            CHECK_MSG(tp_plan_make(&c, n, r, &p) == KITE_OK, "N=%d rank %d: %s", (int)n, (int)r, kite_last_error());
            CHECK(p.n_ranks == n && p.rank == r);
            q_heads[r] = p.q_heads;
            kv_heads[r] = p.kv_heads;
            q_rows[r] = p.q_rows;
            kv_rows[r] = p.kv_rows;
            inter[r] = p.intermediate;
            vocab[r] = p.vocab;
            /* Whole heads, and a rank's query heads read exactly its own kv heads. */
            CHECK(p.q_rows.begin == p.q_heads.begin * c.head_dim && p.q_rows.count == p.q_heads.count * c.head_dim);
            CHECK(p.kv_rows.begin == p.kv_heads.begin * c.head_dim);
            const int32_t group = c.n_heads / c.n_kv_heads;
            CHECK(p.q_heads.begin / group == p.kv_heads.begin);
            CHECK((p.q_heads.begin + p.q_heads.count - 1) / group == p.kv_heads.begin + p.kv_heads.count - 1);
        }
        check_tiles(q_heads, n, c.n_heads, "query heads");
        check_tiles(kv_heads, n, c.n_kv_heads, "kv heads");
        check_tiles(q_rows, n, c.n_heads * c.head_dim, "q rows");
        check_tiles(kv_rows, n, c.n_kv_heads * c.head_dim, "kv rows");
        check_tiles(inter, n, c.intermediate_size, "intermediate");
        check_tiles(vocab, n, c.vocab_size, "vocabulary");
    }
}

static void test_uneven_vocabulary(void) {
    /* 1001 rows over 4 ranks: the first 1001 % 4 = 1 rank holds one more. */
    const int32_t expected_begin[4] = {0, 251, 501, 751}, expected_count[4] = {251, 250, 250, 250};
    for (int32_t r = 0; r < 4; r++) {
        const tp_range got = tp_split_uneven(1001, 4, r);
        CHECK_MSG(got.begin == expected_begin[r] && got.count == expected_count[r], "rank %d: [%d, +%d)", (int)r,
                  (int)got.begin, (int)got.count);
    }
    const tp_range last = tp_split_uneven(10, 4, 3);
    CHECK(last.begin == 8 && last.count == 2);
}

static void expect_refusal(const qwen3_config *c, int32_t n, int32_t rank, kite_status code, const char *needle) {
    tp_plan p;
    const kite_status status = tp_plan_make(c, n, rank, &p);
    CHECK_MSG(status == code, "N=%d rank %d: status %d, expected %d", (int)n, (int)rank, (int)status, (int)code);
    CHECK_MSG(strstr(kite_last_error(), needle) != NULL, "N=%d: message \"%s\" does not name \"%s\"", (int)n,
              kite_last_error(), needle);
}

static void test_refusals_name_the_field(void) {
    const qwen3_config ok = config_of(8, 4, 128, 1001);
    expect_refusal(&ok, 0, 0, KITE_ERROR_INVALID_ARGUMENT, "degree 0");
    expect_refusal(&ok, -2, 0, KITE_ERROR_INVALID_ARGUMENT, "degree -2");
    expect_refusal(&ok, 2, 2, KITE_ERROR_INVALID_ARGUMENT, "rank 2");
    const qwen3_config heads = config_of(6, 6, 128, 1001);
    expect_refusal(&heads, 4, 0, KITE_ERROR_UNSUPPORTED,
                   "num_attention_heads 6 is not divisible by the "
                   "tensor-parallel degree 4");
    /* tests/data/tiny's shape: 2 query heads over 1 kv head. */
    const qwen3_config kv = config_of(2, 1, 96, 151936);
    expect_refusal(&kv, 2, 1, KITE_ERROR_UNSUPPORTED,
                   "num_key_value_heads 1 is not divisible by the "
                   "tensor-parallel degree 2");
    const qwen3_config inter = config_of(4, 4, 66, 1001);
    expect_refusal(&inter, 4, 0, KITE_ERROR_UNSUPPORTED, "intermediate_size 66");
    const qwen3_config vocab = config_of(4, 4, 64, 3);
    expect_refusal(&vocab, 4, 0, KITE_ERROR_UNSUPPORTED, "vocab_size 3");
}

int main(void) {
    TEST_RUN(test_split_covers_every_dimension);
    TEST_RUN(test_uneven_vocabulary);
    TEST_RUN(test_refusals_name_the_field);
    return test_finish();
}

/* The serving benchmark's stream reader (bench/serve_stream.c) on bytes written here: OpenAI completion chunks split
 * at every byte, CRLF and CR line ends, multi-line data, comments and other fields, and each malformed stream refused
 * with its reason; and its percentiles (bench/serve_report.c) against numpy's linear interpolation. */
#include <math.h>
#include <string.h>

#include "serve_report.h"
#include "serve_stream.h"
#include "test_util.h"

static const char *good_stream =
    ": a comment\n"
    "data: {\"choices\":[{\"index\":0,\"text\":\"Hel\",\"finish_reason\":null}],\"usage\":null}\n\n"
    "event: message\n"
    "data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":null}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"text\":\"lo\",\"finish_reason\":\"length\"}]}\n\n"
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}\n\n"
    "data: [DONE]\n\n";

static void check_good(const serve_stream *s) {
    CHECK(!s->failed);
    CHECK(s->done);
    CHECK(s->text.length == 5 && memcmp(s->text.data, "Hello", 5) == 0);
    CHECK(strcmp(s->finish_reason, "length") == 0);
    CHECK(s->has_usage && s->prompt_tokens == 5 && s->completion_tokens == 3);
    /* Three chunks with a choice: the empty one too (a character still incomplete is a token all the same). */
    CHECK(s->n_chunk_times == 3);
}

static void test_whole_and_split(void) {
    serve_stream s = {0};
    CHECK(serve_stream_feed(&s, good_stream, strlen(good_stream), 1.0));
    CHECK(serve_stream_finish(&s));
    check_good(&s);
    serve_stream_free(&s);

    /* One byte at a time, each stamped with its position: a chunk's time is that of the byte that ends it. */
    serve_stream t = {0};
    const size_t n = strlen(good_stream);
    for (size_t i = 0; i < n; i++)
        CHECK(serve_stream_feed(&t, good_stream + i, 1, (double)i));
    CHECK(serve_stream_finish(&t));
    check_good(&t);
    const char *first_end = strstr(good_stream, "}\n\n") + 2;
    CHECK(t.chunk_times[0] == (double)(first_end - good_stream));
    serve_stream_free(&t);
}

static void test_line_ends(void) {
    const char *crlf = "data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":\"length\"}],"
                       "\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\r\n\r\ndata: [DONE]\r\n\r\n";
    const char *cr = "data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":\"length\"}],"
                     "\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\r\rdata: [DONE]\r\r";
    const char *split = "data: {\"choices\":[{\"text\":\"a\",\ndata: \"finish_reason\":\"length\"}],"
                        "\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\ndata:[DONE]\n\n";
    const char *cases[] = {crlf, cr, split};
    for (size_t c = 0; c < 3; c++) {
        for (size_t cut = 0; cut <= strlen(cases[c]); cut++) {
            serve_stream s = {0};
            CHECK(serve_stream_feed(&s, cases[c], cut, 0));
            CHECK(serve_stream_feed(&s, cases[c] + cut, strlen(cases[c]) - cut, 0));
            CHECK_MSG(serve_stream_finish(&s), "case %zu cut %zu: %s", c, cut, s.error);
            CHECK(s.text.length == 1 && s.completion_tokens == 1 && strcmp(s.finish_reason, "length") == 0);
            serve_stream_free(&s);
        }
    }
}

static void expect_failure(const char *stream, const char *reason) {
    serve_stream s = {0};
    bool fed = serve_stream_feed(&s, stream, strlen(stream), 0);
    bool finished = serve_stream_finish(&s);
    CHECK_MSG(!fed || !finished, "accepted: %s", stream);
    CHECK_MSG(s.failed && strstr(s.error, reason) != NULL, "error '%s', expected '%s'", s.error, reason);
    serve_stream_free(&s);
}

static void test_refusals(void) {
    expect_failure("data: {\"choices\":[{\"text\":\"a\"}]}\n\n", "before data: [DONE]");
    expect_failure("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n", "inside an event");
    expect_failure("data: [DONE]\n\ndata: {\"choices\":[]}\n\n", "after data: [DONE]");
    expect_failure("data: {\"choices\":[{\"text\":\"a\"}\n\n", "not JSON");
    expect_failure("data: {\"error\":{\"message\":\"out of blocks\"}}\n\n", "error event: out of blocks");
    expect_failure("data: {\"object\":\"x\"}\n\n", "no \"choices\" array");
    expect_failure("data: {\"choices\":[{\"text\":1}]}\n\n", "no string \"text\"");
    expect_failure("data: {\"choices\":[{\"text\":\"a\"},{\"text\":\"b\"}]}\n\n", "2 choices");
    expect_failure("data: {\"choices\":[{\"index\":1,\"text\":\"a\"}]}\n\n", "index other than 0");
    expect_failure("data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":\"length\"}]}\n\n"
                   "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n",
                   "two chunks carry a finish_reason");
    expect_failure("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n", "no integer prompt_tokens");
    expect_failure("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n"
                   "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n",
                   "two chunks carry a usage");
}

/* A closing chunk with only the finish reason is not a token's arrival. */
static void test_closing_chunk_not_timed(void) {
    const char *stream = "data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":null}]}\n\n"
                         "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}],"
                         "\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n";
    serve_stream s = {0};
    CHECK(serve_stream_feed(&s, stream, strlen(stream), 0));
    CHECK(serve_stream_finish(&s));
    CHECK(s.n_chunk_times == 1 && strcmp(s.finish_reason, "length") == 0);
    serve_stream_free(&s);
}

static void test_percentiles(void) {
    /* numpy.percentile([5, 1, 4, 2, 3], [0, 50, 90, 99, 100]) = 1, 3, 4.6, 4.96, 5 */
    double v[] = {5, 1, 4, 2, 3};
    CHECK(serve_percentile(v, 5, 0) == 1);
    CHECK(serve_percentile(v, 5, 50) == 3);
    CHECK(fabs(serve_percentile(v, 5, 90) - 4.6) < 1e-12);
    CHECK(fabs(serve_percentile(v, 5, 99) - 4.96) < 1e-12);
    CHECK(serve_percentile(v, 5, 100) == 5);
    double one[] = {7};
    CHECK(serve_percentile(one, 1, 99) == 7);
    CHECK(serve_percentile(NULL, 0, 50) == 0);
}

int main(void) {
    TEST_RUN(test_whole_and_split);
    TEST_RUN(test_line_ends);
    TEST_RUN(test_refusals);
    TEST_RUN(test_closing_chunk_not_timed);
    TEST_RUN(test_percentiles);
    return test_finish();
}

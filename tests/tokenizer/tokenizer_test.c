/* The tokenizer against Hugging Face tokenizers: the golden vectors, the differential corpus
 * (tests/data/tokenizer/corpus-qwen3.jsonl, made by make_corpus.py), round trips, the streaming
 * detokenizer, threads sharing one tokenizer, and damaged tokenizer.json files. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"
#include "util/json.h"

#define DATA_DIR KITE_TEST_DATA_DIR "/tokenizer"

static tokenizer *qwen3;

/* ---- corpus ------------------------------------------------------------------------------------- */

typedef struct corpus_case {
    char *category;
    char *input; /* the bytes encode gets */
    size_t input_length;
    int32_t *ids;
    size_t n_ids;
    char *decoded;
    size_t decoded_length;
} corpus_case;

static corpus_case *cases;
static size_t n_cases;

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static char *copy_bytes(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) abort();
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

static bool case_from_json(const json_value *row, corpus_case *c) {
    const json_value *category = json_object_member(row, "category");
    const json_value *text = json_object_member(row, "text");
    const json_value *hex = json_object_member(row, "hex");
    const json_value *ids = json_object_member(row, "ids");
    const json_value *decoded = json_object_member(row, "decoded");
    if (!json_is_array(ids) || !json_is_string(decoded)) return false;
    c->category = copy_bytes(json_is_string(category) ? category->as.string : "", json_is_string(category) ? category->length : 0);
    if (json_is_string(text)) {
        c->input = copy_bytes(text->as.string, text->length);
        c->input_length = text->length;
    } else if (json_is_string(hex) && hex->length % 2 == 0) {
        c->input_length = hex->length / 2;
        c->input = malloc(c->input_length + 1);
        if (!c->input) abort();
        for (size_t i = 0; i < c->input_length; i++) {
            int hi = hex_value(hex->as.string[2 * i]), lo = hex_value(hex->as.string[2 * i + 1]);
            if (hi < 0 || lo < 0) return false;
            c->input[i] = (char)(hi * 16 + lo);
        }
        c->input[c->input_length] = '\0';
    } else {
        return false;
    }
    c->n_ids = ids->length;
    c->ids = malloc((ids->length + 1) * sizeof *c->ids);
    if (!c->ids) abort();
    for (size_t i = 0; i < ids->length; i++) {
        int64_t v;
        if (!json_get_int64(&ids->as.items[i], &v)) return false;
        c->ids[i] = (int32_t)v;
    }
    c->decoded = copy_bytes(decoded->as.string, decoded->length);
    c->decoded_length = decoded->length;
    return true;
}

static void load_corpus(const char *path) {
    size_t length;
    char *text = test_read_file(path, &length);
    if (!text) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(1);
    }
    size_t capacity = 4096;
    cases = calloc(capacity, sizeof *cases);
    char *line = text;
    while (line < text + length) {
        char *end = memchr(line, '\n', (size_t)(text + length - line));
        if (!end) end = text + length;
        if (end > line) {
            json_error error;
            json_document *doc = json_parse(line, (size_t)(end - line), &error);
            if (!doc || !case_from_json(json_root(doc), &cases[n_cases])) {
                fprintf(stderr, "%s: bad line %zu\n", path, n_cases + 1);
                exit(1);
            }
            json_free(doc);
            if (++n_cases == capacity) {
                capacity *= 2;
                cases = realloc(cases, capacity * sizeof *cases);
                if (!cases) abort();
            }
        }
        line = end + 1;
    }
    free(text);
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "    %s (%zu):", label, n);
    for (size_t i = 0; i < n && i < 64; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 64 ? " ...\n" : "\n");
}

static bool ids_equal(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

static void test_golden(void) {
    size_t length;
    char *text = test_read_file(DATA_DIR "/tokenizer-qwen3.json", &length);
    CHECK(text != NULL);
    if (!text) return;
    json_error error;
    json_document *doc = json_parse(text, length, &error);
    CHECK(doc != NULL);
    const json_value *list = json_object_member(json_root(doc), "cases");
    CHECK(json_is_array(list));
    size_t n_checked = 0;
    for (size_t i = 0; list && i < list->length; i++) {
        corpus_case c = {0};
        CHECK(case_from_json(&list->as.items[i], &c));
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(tokenizer_encode(qwen3, c.input, c.input_length, &ids, &n) == KITE_OK);
        CHECK_MSG(ids_equal(ids, n, c.ids, c.n_ids), "golden case %zu: %s", i, c.input);
        char *decoded = NULL;
        size_t decoded_length = 0;
        CHECK(tokenizer_decode(qwen3, c.ids, c.n_ids, &decoded, &decoded_length) == KITE_OK);
        CHECK_MSG(decoded_length == c.decoded_length && memcmp(decoded, c.decoded, decoded_length) == 0,
                  "golden decode %zu", i);
        n_checked++;
        free(decoded);
        free(ids);
        free(c.category);
        free(c.input);
        free(c.ids);
        free(c.decoded);
    }
    CHECK(n_checked >= 20);
    printf("  golden: %zu cases\n", n_checked);
    json_free(doc);
    free(text);
}

/* NFC of valid UTF-8, for decode(encode(x)) == NFC(x). */
static char *nfc(const char *text, size_t length, size_t *out_length) {
    utf8proc_uint8_t *out = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)length, &out,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (n < 0) return NULL;
    *out_length = (size_t)n;
    return (char *)out;
}

static void test_corpus(void) {
    size_t identical = 0, round_trips = 0, by_category_failures = 0;
    for (size_t i = 0; i < n_cases; i++) {
        const corpus_case *c = &cases[i];
        int32_t *ids = NULL;
        size_t n = 0;
        kite_status status = tokenizer_encode(qwen3, c->input, c->input_length, &ids, &n);
        CHECK_MSG(status == KITE_OK, "case %zu: %s", i, kite_last_error());
        if (ids_equal(ids, n, c->ids, c->n_ids)) {
            identical++;
        } else if (by_category_failures++ < 12) {
            fprintf(stderr, "  corpus case %zu (%s) differs: %.*s\n", i + 1, c->category, (int)(c->input_length < 200 ? c->input_length : 200), c->input);
            print_ids("kite", ids, n);
            print_ids("hf  ", c->ids, c->n_ids);
        }
        char *decoded = NULL;
        size_t decoded_length = 0;
        CHECK(tokenizer_decode(qwen3, ids, n, &decoded, &decoded_length) == KITE_OK);
        bool same_as_hf = decoded && decoded_length == c->decoded_length && memcmp(decoded, c->decoded, decoded_length) == 0;
        CHECK_MSG(same_as_hf, "case %zu: decode differs from Hugging Face's", i + 1);
        /* decode(encode(x)) == NFC(x), x with invalid UTF-8 replaced as encode documents. */
        char *repaired = NULL;
        size_t repaired_length = 0;
        CHECK(utf8_repair(c->input, c->input_length, &repaired, &repaired_length) == KITE_OK);
        size_t nfc_length = 0;
        char *expected = repaired ? nfc(repaired, repaired_length, &nfc_length) : nfc(c->input, c->input_length, &nfc_length);
        if (expected && decoded && nfc_length == decoded_length && memcmp(expected, decoded, nfc_length) == 0)
            round_trips++;
        else
            CHECK_MSG(false, "case %zu: decode(encode(x)) != NFC(x)", i + 1);
        free(expected);
        free(repaired);
        free(decoded);
        free(ids);
    }
    printf("  corpus: %zu strings, %zu with identical ids, %zu round trips equal NFC(x)\n", n_cases, identical,
           round_trips);
    CHECK(n_cases >= 2000);
    CHECK_MSG(identical == n_cases, "%zu of %zu corpus strings differ", n_cases - identical, n_cases);
}

/* ---- streaming ---------------------------------------------------------------------------------- */

static bool stream_equals_decode(const int32_t *ids, size_t n) {
    char *full = NULL;
    size_t full_length = 0;
    if (tokenizer_decode(qwen3, ids, n, &full, &full_length) != KITE_OK) return false;
    detokenizer *d = NULL;
    if (detokenizer_create(qwen3, &d) != KITE_OK) return false;
    char *streamed = malloc(full_length * 3 + 16);
    size_t at = 0;
    bool ok = streamed != NULL;
    for (size_t i = 0; ok && i <= n; i++) {
        const char *piece;
        size_t length;
        kite_status status = i < n ? detokenizer_push(d, ids[i], &piece, &length) : detokenizer_flush(d, &piece, &length);
        if (status != KITE_OK || at + length > full_length) {
            ok = false;
            break;
        }
        memcpy(streamed + at, piece, length);
        at += length;
    }
    ok = ok && at == full_length && memcmp(streamed, full, full_length) == 0;
    detokenizer_free(d);
    free(streamed);
    free(full);
    return ok;
}

static void test_streaming(void) {
    size_t good = 0;
    for (size_t i = 0; i < n_cases; i++) {
        if (stream_equals_decode(cases[i].ids, cases[i].n_ids))
            good++;
        else
            CHECK_MSG(false, "case %zu: streamed text differs from decode", i + 1);
    }
    /* Random byte tokens make broken, cut and valid UTF-8 sequences in every arrangement. */
    uint64_t state = 12345;
    for (int round = 0; round < 2000; round++) {
        int32_t ids[24];
        size_t n = 1 + round % 24;
        for (size_t i = 0; i < n; i++) {
            state = state * 6364136223846793005ULL + 1442695040888963407ULL;
            unsigned r = (unsigned)(state >> 33);
            if (r % 5 == 0) {
                ids[i] = (int32_t)(r % 151669u);
            } else {
                static const unsigned char interesting[] = {0x41, 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xF0, 0x9F,
                                                            0x98, 0x80, 0xED, 0xA0, 0xFF, 0xC0, 0xF4, 0x90};
                ids[i] = qwen3->byte_to_id[interesting[r % sizeof interesting]];
            }
        }
        CHECK_MSG(stream_equals_decode(ids, n), "random stream %d", round);
    }
    printf("  streaming: %zu corpus sequences + 2000 random ones\n", good);

    detokenizer *d = NULL;
    CHECK(detokenizer_create(qwen3, &d) == KITE_OK);
    const char *text;
    size_t length;
    CHECK(detokenizer_push(d, 151669, &text, &length) == KITE_ERROR_INVALID_INPUT);
    CHECK(detokenizer_push(d, -1, &text, &length) == KITE_ERROR_INVALID_INPUT);
    /* "€" is E2 82 AC: nothing comes out until its last byte does. */
    CHECK(detokenizer_push(d, qwen3->byte_to_id[0xE2], &text, &length) == KITE_OK && length == 0);
    CHECK(detokenizer_push(d, qwen3->byte_to_id[0x82], &text, &length) == KITE_OK && length == 0);
    CHECK(detokenizer_push(d, qwen3->byte_to_id[0xAC], &text, &length) == KITE_OK && length == 3 &&
          memcmp(text, "\xE2\x82\xAC", 3) == 0);
    CHECK(detokenizer_push(d, qwen3->byte_to_id[0xE2], &text, &length) == KITE_OK && length == 0);
    CHECK(detokenizer_flush(d, &text, &length) == KITE_OK && length == 3 && memcmp(text, "\xEF\xBF\xBD", 3) == 0);
    detokenizer_free(d);
}

/* ---- API details -------------------------------------------------------------------------------- */

static void test_api(void) {
    CHECK(tokenizer_vocab_size(qwen3) == 151669);
    CHECK(tokenizer_token_to_id(qwen3, "<|im_end|>") == 151645);
    CHECK(tokenizer_token_to_id(qwen3, "<think>") == 151667);
    CHECK(tokenizer_token_to_id(qwen3, "\xC4\xA0the") == 279); /* "Ġthe" */
    CHECK(tokenizer_token_to_id(qwen3, "hello") == 14990);
    CHECK(tokenizer_token_to_id(qwen3, "no such token at all") == -1);
    CHECK(tokenizer_token_to_id(qwen3, "") == -1);
    CHECK(tokenizer_eos_id(qwen3) == 151645);
    CHECK(tokenizer_bos_id(qwen3) == -1);
    CHECK(!tokenizer_add_bos(qwen3));
    CHECK(tokenizer_is_special(qwen3, 151643));
    CHECK(!tokenizer_is_special(qwen3, 151667)); /* <think> is added but not special */
    CHECK(!tokenizer_is_special(qwen3, 100));
    size_t length = 0;
    const char *bytes = tokenizer_token_bytes(qwen3, 279, &length);
    CHECK(bytes && length == 4 && memcmp(bytes, " the", 4) == 0);
    CHECK(tokenizer_token_bytes(qwen3, 151669, &length) == NULL);

    int32_t *ids = NULL;
    size_t n = 7;
    CHECK(tokenizer_encode(qwen3, "", 0, &ids, &n) == KITE_OK && n == 0 && ids == NULL);
    CHECK(tokenizer_encode(qwen3, NULL, 0, &ids, &n) == KITE_OK && n == 0);
    CHECK(tokenizer_encode(qwen3, NULL, 3, &ids, &n) == KITE_ERROR_INVALID_ARGUMENT);
    char *text = NULL;
    CHECK(tokenizer_decode(qwen3, NULL, 0, &text, &length) == KITE_OK && text && text[0] == '\0' && length == 0);
    free(text);
    int32_t bad[] = {1, 151669};
    CHECK(tokenizer_decode(qwen3, bad, 2, &text, &length) == KITE_ERROR_INVALID_INPUT);
    CHECK(strstr(kite_last_error(), "151669") != NULL);
    int32_t negative[] = {-5};
    CHECK(tokenizer_decode(qwen3, negative, 1, &text, &length) == KITE_ERROR_INVALID_INPUT);

    /* Embedded NUL bytes are text like any other. */
    CHECK(tokenizer_encode(qwen3, "a\0b", 3, &ids, &n) == KITE_OK && n >= 2);
    CHECK(tokenizer_decode(qwen3, ids, n, &text, &length) == KITE_OK && length == 3 && memcmp(text, "a\0b", 3) == 0);
    free(text);
    free(ids);
}

/* Long runs stress the regex (JIT stack) and BPE (heap merge, no cache). */
static void test_long_inputs(void) {
    static const char *const units[] = {" ", "a", "1", "\n", "\r\n", "😀", "ab", "日本", "!", "\xff", "é"};
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        size_t unit = strlen(units[u]), repeat = 200000 / unit;
        char *text = malloc(unit * repeat + 1);
        for (size_t i = 0; i < repeat; i++) memcpy(text + i * unit, units[u], unit);
        int32_t *ids = NULL;
        size_t n = 0;
        kite_status status = tokenizer_encode(qwen3, text, unit * repeat, &ids, &n);
        CHECK_MSG(status == KITE_OK, "long run of '%s': %s", units[u], kite_last_error());
        char *decoded = NULL;
        size_t length = 0;
        CHECK(tokenizer_decode(qwen3, ids, n, &decoded, &length) == KITE_OK);
        if (units[u][0] != '\xff')
            CHECK_MSG(length == unit * repeat && memcmp(decoded, text, length) == 0, "long run of '%s' round trip", units[u]);
        free(decoded);
        free(ids);
        free(text);
    }
}

/* ---- threads ------------------------------------------------------------------------------------ */

typedef struct thread_job {
    size_t first;
    size_t mismatches;
} thread_job;

static void *thread_encode(void *arg) {
    thread_job *job = arg;
    for (size_t k = 0; k < n_cases; k++) {
        const corpus_case *c = &cases[(job->first + k * 7) % n_cases];
        int32_t *ids = NULL;
        size_t n = 0;
        if (tokenizer_encode(qwen3, c->input, c->input_length, &ids, &n) != KITE_OK || !ids_equal(ids, n, c->ids, c->n_ids))
            job->mismatches++;
        free(ids);
    }
    return NULL;
}

static void test_threads(void) {
    enum { N_THREADS = 4 };
    pthread_t threads[N_THREADS];
    thread_job jobs[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        jobs[i] = (thread_job){(size_t)i * 997, 0};
        CHECK(pthread_create(&threads[i], NULL, thread_encode, &jobs[i]) == 0);
    }
    size_t mismatches = 0;
    for (int i = 0; i < N_THREADS; i++) {
        CHECK(pthread_join(threads[i], NULL) == 0);
        mismatches += jobs[i].mismatches;
    }
    CHECK_MSG(mismatches == 0, "%zu mismatches across threads", mismatches);
}

/* ---- damaged and unsupported tokenizer.json ----------------------------------------------------- */

/* A small byte-level BPE tokenizer.json: the 256 byte symbols, merges "h e" -> "he", "l l" -> "ll",
 * "he ll" -> "hell", "hell o" -> "hello", with pieces of it replaceable by the tests. */
typedef struct mini_options {
    const char *model_extra;   /* inserted into the model object */
    const char *merges;        /* the merges array */
    const char *vocab_extra;   /* appended to the vocab object */
    const char *normalizer;
    const char *pre_tokenizer;
    const char *decoder;
    const char *added_tokens;
    bool no_model;
} mini_options;

static void append(char **buffer, size_t *length, size_t *capacity, const char *s) {
    size_t n = strlen(s);
    if (*length + n + 1 > *capacity) {
        while (*length + n + 1 > *capacity) *capacity = *capacity ? *capacity * 2 : 4096;
        *buffer = realloc(*buffer, *capacity);
        if (!*buffer) abort();
    }
    memcpy(*buffer + *length, s, n + 1);
    *length += n;
}

static char *mini_json(const mini_options *o) {
    char *b = NULL;
    size_t n = 0, cap = 0;
    uint32_t byte_to_char[256];
    byte_level_tables(byte_to_char);
    append(&b, &n, &cap, "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":");
    append(&b, &n, &cap, o->added_tokens ? o->added_tokens : "[]");
    append(&b, &n, &cap, ",\"normalizer\":");
    append(&b, &n, &cap, o->normalizer ? o->normalizer : "{\"type\":\"NFC\"}");
    append(&b, &n, &cap, ",\"pre_tokenizer\":");
    append(&b, &n, &cap,
           o->pre_tokenizer ? o->pre_tokenizer
                            : "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
                              "\"\\\\s+|\\\\S+\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
                              "\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}]}");
    append(&b, &n, &cap, ",\"post_processor\":null,\"decoder\":");
    append(&b, &n, &cap, o->decoder ? o->decoder : "{\"type\":\"ByteLevel\"}");
    if (!o->no_model) {
        append(&b, &n, &cap, ",\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,");
        if (o->model_extra) append(&b, &n, &cap, o->model_extra);
        append(&b, &n, &cap, "\"vocab\":{");
        for (int i = 0; i < 256; i++) {
            char entry[32], symbol[8];
            uint32_t c = byte_to_char[i];
            if (c == '"' || c == '\\')
                snprintf(symbol, sizeof symbol, "\\%c", (char)c);
            else if (c < 0x80)
                snprintf(symbol, sizeof symbol, "%c", (char)c);
            else
                snprintf(symbol, sizeof symbol, "%c%c", (char)(0xC0 | (c >> 6)), (char)(0x80 | (c & 0x3F)));
            snprintf(entry, sizeof entry, "%s\"%s\":%d", i ? "," : "", symbol, i);
            append(&b, &n, &cap, entry);
        }
        append(&b, &n, &cap, ",\"he\":256,\"ll\":257,\"hell\":258,\"hello\":259");
        if (o->vocab_extra) append(&b, &n, &cap, o->vocab_extra);
        append(&b, &n, &cap, "},\"merges\":");
        append(&b, &n, &cap, o->merges ? o->merges : "[\"h e\",[\"l\",\"l\"],\"he ll\",\"hell o\"]");
        append(&b, &n, &cap, "}");
    }
    append(&b, &n, &cap, "}");
    return b;
}

static kite_status load_mini(const mini_options *o, tokenizer **t) {
    char *json = mini_json(o);
    kite_status status = tokenizer_load_json(json, strlen(json), "mini/tokenizer.json", t);
    free(json);
    return status;
}

static void expect_failure(const mini_options *o, kite_status expected, const char *needle) {
    tokenizer *t = NULL;
    kite_status status = load_mini(o, &t);
    CHECK_MSG(status == expected, "expected %s, got %s (%s)", kite_status_string(expected), kite_status_string(status),
              kite_last_error());
    CHECK_MSG(strstr(kite_last_error(), needle) != NULL, "message '%s' lacks '%s'", kite_last_error(), needle);
    CHECK(t == NULL);
    tokenizer_free(t);
}

static void test_damaged(void) {
    tokenizer *t = NULL;
    mini_options ok = {0};
    CHECK_MSG(load_mini(&ok, &t) == KITE_OK, "%s", kite_last_error());
    if (t) {
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(tokenizer_encode(t, "hello  hell", 11, &ids, &n) == KITE_OK);
        int32_t expected[] = {259, 32, 32, 258};
        CHECK(ids_equal(ids, n, expected, 4));
        free(ids);
        tokenizer_free(t);
    }
    expect_failure(&(mini_options){.no_model = true}, KITE_ERROR_INVALID_TOKENIZER, "no \"model\"");
    expect_failure(&(mini_options){.merges = "[\"h zz\"]"}, KITE_ERROR_INVALID_TOKENIZER, "merges[0]: token \"zz\" is not in the vocab");
    expect_failure(&(mini_options){.merges = "[\"h e\",\"e h\"]"}, KITE_ERROR_INVALID_TOKENIZER, "merged token \"eh\"");
    expect_failure(&(mini_options){.merges = "[\"h e x\"]"}, KITE_ERROR_INVALID_TOKENIZER, "merges[0]");
    expect_failure(&(mini_options){.merges = "[[\"h\"]]"}, KITE_ERROR_INVALID_TOKENIZER, "merges[0]");
    expect_failure(&(mini_options){.vocab_extra = ",\"dup\":256"}, KITE_ERROR_INVALID_TOKENIZER, "id 256 is given to both");
    expect_failure(&(mini_options){.vocab_extra = ",\"he\":300"}, KITE_ERROR_INVALID_TOKENIZER,
                   "mini/tokenizer.json:1:");
    expect_failure(&(mini_options){.vocab_extra = ",\"he\":300"}, KITE_ERROR_INVALID_TOKENIZER, ": duplicate key \"he\"");
    /* The same refusals whichever way the vocab is read: a repeated key that is not byte-level, one whose
     * repeat an added token takes over, one written with an escape. */
    expect_failure(&(mini_options){.vocab_extra = ",\"\u20acx\":300,\"\u20acx\":301"}, KITE_ERROR_INVALID_TOKENIZER,
                   ": duplicate key \"\u20acx\"");
    expect_failure(&(mini_options){.vocab_extra = ",\"he\":300",
                                   .added_tokens = "[{\"id\":300,\"content\":\"<x>\",\"special\":true}]"},
                   KITE_ERROR_INVALID_TOKENIZER, ": duplicate key \"he\"");
    expect_failure(&(mini_options){.vocab_extra = ",\"h\\u0065\":300"}, KITE_ERROR_INVALID_TOKENIZER,
                   ": duplicate key \"he\"");
    /* a small object too: the model's type given twice, the second one what tokenizers would read */
    expect_failure(&(mini_options){.model_extra = "\"type\":\"WordPiece\","}, KITE_ERROR_INVALID_TOKENIZER,
                   ": duplicate key \"type\"");
    expect_failure(&(mini_options){.vocab_extra = ",\"neg\":-1"}, KITE_ERROR_INVALID_TOKENIZER, "model.vocab[\"neg\"]");
    expect_failure(&(mini_options){.pre_tokenizer = "{\"type\":\"Whitespace\"}"}, KITE_ERROR_UNSUPPORTED, "\"Whitespace\"");
    expect_failure(&(mini_options){.pre_tokenizer = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Metaspace\"}]}"},
                   KITE_ERROR_UNSUPPORTED, "\"Metaspace\"");
    expect_failure(&(mini_options){.pre_tokenizer = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
                                                    "\"pattern\":{\"Regex\":\"x\"},\"behavior\":\"Removed\",\"invert\":false},"
                                                    "{\"type\":\"ByteLevel\",\"use_regex\":false}]}"},
                   KITE_ERROR_UNSUPPORTED, "behavior \"Removed\"");
    expect_failure(&(mini_options){.pre_tokenizer = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
                                                    "\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\",\"invert\":false},"
                                                    "{\"type\":\"ByteLevel\",\"use_regex\":false}]}"},
                   KITE_ERROR_UNSUPPORTED, "regex not accepted by PCRE2");
    expect_failure(&(mini_options){.pre_tokenizer = "{\"type\":\"ByteLevel\",\"add_prefix_space\":true}"},
                   KITE_ERROR_UNSUPPORTED, "add_prefix_space");
    expect_failure(&(mini_options){.normalizer = "{\"type\":\"NFKC\"}"}, KITE_ERROR_UNSUPPORTED, "normalizer type \"NFKC\"");
    expect_failure(&(mini_options){.normalizer = "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Lowercase\"}]}"},
                   KITE_ERROR_UNSUPPORTED, "\"Lowercase\"");
    expect_failure(&(mini_options){.decoder = "{\"type\":\"WordPiece\"}"}, KITE_ERROR_UNSUPPORTED, "decoder type \"WordPiece\"");
    expect_failure(&(mini_options){.model_extra = "\"byte_fallback\":true,"}, KITE_ERROR_UNSUPPORTED, "byte_fallback");
    expect_failure(&(mini_options){.model_extra = "\"continuing_subword_prefix\":\"##\","}, KITE_ERROR_UNSUPPORTED,
                   "continuing_subword_prefix");
    expect_failure(&(mini_options){.added_tokens = "[{\"id\":300,\"content\":\"<a>\"},{\"id\":300,\"content\":\"<b>\"}]"},
                   KITE_ERROR_INVALID_TOKENIZER, "id 300 is used twice");
    expect_failure(&(mini_options){.added_tokens = "[{\"content\":\"<a>\"}]"}, KITE_ERROR_INVALID_TOKENIZER, "added_tokens[0]");
    /* Ids far past the tokens given are refused before the tables are sized by them (id 200000000 cost 2.7 GB
     * of tables before): the bound is twice the tokens plus 65536, here 2 * 261 + 65536. */
    expect_failure(&(mini_options){.added_tokens = "[{\"id\":200000000,\"content\":\"<a>\"}]"},
                   KITE_ERROR_INVALID_TOKENIZER, "added_tokens[0].id: 200000000 is not in [0, 66058) for 261 tokens");
    expect_failure(&(mini_options){.added_tokens = "[{\"id\":300,\"content\":\"<a>\"},{\"id\":2147483646,\"content\":\"<b>\"}]"},
                   KITE_ERROR_INVALID_TOKENIZER, "added_tokens[1].id: 2147483646");
    expect_failure(&(mini_options){.vocab_extra = ",\"far\":66060"}, KITE_ERROR_INVALID_TOKENIZER,
                   "model.vocab[\"far\"]: expected an id in [0, 66058) for 261 tokens");
    {
        mini_options gap = {.added_tokens = "[{\"id\":66057,\"content\":\"<a>\"}]"}; /* a gap within the bound */
        CHECK_MSG(load_mini(&gap, &t) == KITE_OK, "%s", kite_last_error());
        CHECK(tokenizer_vocab_size(t) == 66058);
        tokenizer_free(t);
        t = NULL;
    }

    /* A model of another type, and no vocab. */
    const char *wordpiece = "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}";
    CHECK(tokenizer_load_json(wordpiece, strlen(wordpiece), "wp.json", &t) == KITE_ERROR_UNSUPPORTED);
    CHECK(strstr(kite_last_error(), "model.type \"WordPiece\"") != NULL);
    const char *no_vocab = "{\"model\":{\"type\":\"BPE\",\"merges\":[]}}";
    CHECK(tokenizer_load_json(no_vocab, strlen(no_vocab), "nv.json", &t) == KITE_ERROR_INVALID_TOKENIZER);
    CHECK(strstr(kite_last_error(), "model.vocab is missing") != NULL);

    /* Truncated JSON: the real file cut in half. */
    size_t length;
    char *text = test_read_file(DATA_DIR "/tokenizer.json", &length);
    CHECK(text != NULL);
    if (text) {
        CHECK(tokenizer_load_json(text, length / 2, "half/tokenizer.json", &t) == KITE_ERROR_INVALID_TOKENIZER);
        CHECK(strstr(kite_last_error(), "half/tokenizer.json:") != NULL);
        free(text);
    }
    /* Valid JSON of too many values is refused by a count before it is parsed (60 MB of "0," cost 2 GB). */
    size_t n_values = (size_t)TOKENIZER_JSON_MAX_SEPARATORS + 1;
    char *values = malloc(2 * n_values + 2);
    CHECK(values != NULL);
    if (values) {
        values[0] = '[';
        for (size_t i = 0; i < n_values; i++) {
            values[1 + 2 * i] = '0';
            values[2 + 2 * i] = i + 1 < n_values ? ',' : ']';
        }
        CHECK(tokenizer_load_json(values, 2 * n_values + 1, "many/tokenizer.json", &t) == KITE_ERROR_INVALID_TOKENIZER);
        CHECK_MSG(strstr(kite_last_error(), "many/tokenizer.json: byte ") &&
                      strstr(kite_last_error(), "more than 4000000 commas and brackets"),
                  "%s", kite_last_error());
        free(values);
    }
    CHECK(tokenizer_load("/nonexistent/dir", &t) == KITE_ERROR_IO);
    CHECK(strstr(kite_last_error(), "/nonexistent/dir/tokenizer.json") != NULL);
}

/* tokenizer.json's vocab and merges are read from the text in their plain form and through the JSON reader
 * otherwise (a \u escape is enough): both give the same tokenizer. */
static void test_plain_and_json_reader_agree(void) {
    size_t length;
    char *text = test_read_file(DATA_DIR "/tokenizer.json", &length);
    CHECK(text != NULL);
    if (!text) return;
    static const char plain_key[] = "\"vocab\": {\n      \"!\": 0,";
    static const char escaped_key[] = "\"vocab\": {\n      \"\\u0021\": 0,";
    char *at = strstr(text, plain_key);
    CHECK(at != NULL);
    char *escaped = malloc(length + sizeof escaped_key);
    CHECK(escaped != NULL);
    if (at && escaped) {
        size_t head = (size_t)(at - text), tail = length - head - (sizeof plain_key - 1);
        memcpy(escaped, text, head);
        memcpy(escaped + head, escaped_key, sizeof escaped_key - 1);
        memcpy(escaped + head + sizeof escaped_key - 1, at + sizeof plain_key - 1, tail);
        size_t escaped_length = head + sizeof escaped_key - 1 + tail;
        tokenizer *plain = NULL, *json = NULL;
        CHECK(tokenizer_load_json(text, length, "plain/tokenizer.json", &plain) == KITE_OK);
        CHECK(tokenizer_load_json(escaped, escaped_length, "escaped/tokenizer.json", &json) == KITE_OK);
        if (plain && json) {
            CHECK(tokenizer_vocab_size(plain) == tokenizer_vocab_size(json));
            static const char sample[] = "Hello, world! \"quoted\" back\\slash  caf\u00e9 \u6f22\u5b57 <|im_start|>x 12345";
            int32_t *a = NULL, *b = NULL;
            size_t n_a = 0, n_b = 0;
            CHECK(tokenizer_encode(plain, sample, strlen(sample), &a, &n_a) == KITE_OK);
            CHECK(tokenizer_encode(json, sample, strlen(sample), &b, &n_b) == KITE_OK);
            CHECK_MSG(n_a == n_b && n_a > 0 && memcmp(a, b, n_a * sizeof *a) == 0, "%zu vs %zu ids", n_a, n_b);
            CHECK(tokenizer_token_to_id(plain, "!") == 0 && tokenizer_token_to_id(json, "!") == 0);
            free(a);
            free(b);
        }
        tokenizer_free(plain);
        tokenizer_free(json);
    }
    free(escaped);
    free(text);
}

/* Added-token flags on the mini tokenizer: lstrip / rstrip take the spaces around, single_word only
 * matches between non-word characters, normalized tokens match after NFC. */
static void test_added_flags(void) {
    tokenizer *t = NULL;
    mini_options o = {.added_tokens = "[{\"id\":300,\"content\":\"<L>\",\"lstrip\":true,\"special\":true},"
                                      "{\"id\":301,\"content\":\"<R>\",\"rstrip\":true,\"special\":true},"
                                      "{\"id\":302,\"content\":\"he\",\"single_word\":true,\"special\":true},"
                                      "{\"id\":303,\"content\":\"\xC3\xA9\",\"normalized\":true,\"special\":false}]"};
    CHECK_MSG(load_mini(&o, &t) == KITE_OK, "%s", kite_last_error());
    if (!t) return;
    struct {
        const char *text;
        int32_t ids[8];
        size_t n;
    } cases_[] = {
        {"a  <L>b", {'a', 300, 'b'}, 3},
        {"a<R>  b", {'a', 301, 'b'}, 3},
        {"x he y", {'x', ' ', 302, ' ', 'y'}, 5},
        {"hello", {259}, 1},
        {"e\xCC\x81", {303}, 1}, /* e + combining acute: NFC makes it é, which then matches */
    };
    for (size_t i = 0; i < sizeof cases_ / sizeof cases_[0]; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(tokenizer_encode(t, cases_[i].text, strlen(cases_[i].text), &ids, &n) == KITE_OK);
        CHECK_MSG(ids_equal(ids, n, cases_[i].ids, cases_[i].n), "added-token case %zu", i);
        if (!ids_equal(ids, n, cases_[i].ids, cases_[i].n)) print_ids("kite", ids, n);
        free(ids);
    }
    tokenizer_free(t);
}

int main(void) {
    kite_status status = tokenizer_load(DATA_DIR, &qwen3);
    if (status != KITE_OK) {
        fprintf(stderr, "cannot load the Qwen3 tokenizer: %s\n", kite_last_error());
        return 1;
    }
    load_corpus(DATA_DIR "/corpus-qwen3.jsonl");
    TEST_RUN(test_golden);
    TEST_RUN(test_corpus);
    TEST_RUN(test_streaming);
    TEST_RUN(test_api);
    TEST_RUN(test_long_inputs);
    TEST_RUN(test_threads);
    TEST_RUN(test_damaged);
    TEST_RUN(test_added_flags);
    TEST_RUN(test_plain_and_json_reader_agree);
    for (size_t i = 0; i < n_cases; i++) {
        free(cases[i].category);
        free(cases[i].input);
        free(cases[i].ids);
        free(cases[i].decoded);
    }
    free(cases);
    tokenizer_free(qwen3);
    return test_finish();
}

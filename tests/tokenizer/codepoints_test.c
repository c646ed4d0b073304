/* Every Unicode scalar value through kite's normalizer and split regex, against Hugging Face's results
 * (tests/data/tokenizer/codepoints-qwen3.txt, made by make_corpus.py). This pins the Unicode tables of
 * utf8proc (NFC) and PCRE2 (\p{L}, \p{N}, \s, case folding) to those Hugging Face tokenizers uses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"

#define DATA_DIR KITE_TEST_DATA_DIR "/tokenizer"

static tokenizer *qwen3;

static size_t utf8_put(uint32_t c, char *out) {
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (char)(0xC0 | (c >> 6));
        out[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | (c >> 12));
        out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (c >> 18));
    out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    out[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* make_corpus.py's probe_text: "a" c "b " c "1" c "\n" c " '" c "x" c c "." c "\t". */
static size_t probe_text(uint32_t c, char *out) {
    static const char *const parts[] = {"a", "b ", "1", "\n", " '", "x", "", ".", "\t"};
    size_t n = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        size_t k = strlen(parts[i]);
        memcpy(out + n, parts[i], k);
        n += k;
        if (i + 1 < sizeof parts / sizeof parts[0]) n += utf8_put(c, out + n);
    }
    return n;
}

typedef struct signature {
    char text[512];
    size_t length;
} signature;

static kite_status collect_piece(void *user, const char *piece, size_t length) {
    (void)piece;
    signature *s = user;
    int n = snprintf(s->text + s->length, sizeof s->text - s->length, "%s%zu", s->length ? "," : "", length);
    if (n > 0) s->length += (size_t)n;
    return KITE_OK;
}

static void signature_of(uint32_t c, signature *s) {
    char text[64];
    size_t length = probe_text(c, text);
    char *normalized = NULL;
    size_t normalized_length = 0;
    s->length = 0;
    s->text[0] = '\0';
    if (pretokenize_normalize(qwen3, text, length, &normalized, &normalized_length) != KITE_OK) {
        snprintf(s->text, sizeof s->text, "normalize failed");
        return;
    }
    const char *split = normalized ? normalized : text;
    size_t split_length = normalized ? normalized_length : length;
    if (pretokenize_split(qwen3, split, split_length, collect_piece, s) != KITE_OK) {
        snprintf(s->text, sizeof s->text, "split failed");
        free(normalized);
        return;
    }
    if (normalized && (normalized_length != length || memcmp(normalized, text, length) != 0)) {
        s->length += (size_t)snprintf(s->text + s->length, sizeof s->text - s->length, "|");
        for (size_t i = 0; i < normalized_length && s->length + 3 < sizeof s->text; i++)
            s->length += (size_t)snprintf(s->text + s->length, sizeof s->text - s->length, "%02x",
                                          (unsigned char)normalized[i]);
    }
    free(normalized);
}

static void test_every_code_point(void) {
    size_t length;
    char *table = test_read_file(DATA_DIR "/codepoints-qwen3.txt", &length);
    CHECK(table != NULL);
    if (!table) return;
    size_t checked = 0, differing = 0;
    uint32_t expected_next = 0;
    for (char *line = strtok(table, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        unsigned first, last;
        int consumed = 0;
        if (sscanf(line, "%x %x %n", &first, &last, &consumed) != 2 || consumed == 0) {
            CHECK_MSG(false, "bad line: %s", line);
            break;
        }
        const char *want = line + consumed;
        if (expected_next == 0xD800) expected_next = 0xE000;
        CHECK_MSG(first == expected_next, "ranges not contiguous at %x", first);
        expected_next = last + 1;
        for (uint32_t c = first; c <= last; c++) {
            signature s;
            signature_of(c, &s);
            checked++;
            if (strcmp(s.text, want) != 0) {
                if (differing++ < (getenv("KITE_CP_ALL") ? 100000 : 20)) fprintf(stderr, "  U+%04X: kite %s, hf %s\n", c, s.text, want);
            }
        }
    }
    CHECK(expected_next == 0x110000);
    printf("  %zu code points checked, %zu differ\n", checked, differing);
    CHECK_MSG(differing == 0, "%zu code points differ", differing);
    free(table);
}

int main(void) {
    if (tokenizer_load(DATA_DIR, &qwen3) != KITE_OK) {
        fprintf(stderr, "cannot load the Qwen3 tokenizer: %s\n", kite_last_error());
        return 1;
    }
    TEST_RUN(test_every_code_point);
    tokenizer_free(qwen3);
    return test_finish();
}

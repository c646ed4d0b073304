/* model.vocab and model.merges read straight from tokenizer.json's text, without the JSON reader's tree.
 *
 * The two make nearly all of the file (Qwen3: 151643 members and 151387 merges) and building them as JSON
 * values, then walking those values, cost more than the rest of loading. They are read here only in
 * their plain form: strings without \u escapes, ids written as small non-negative integers, merges as
 * "a b" or ["a", "b"]. Anything else fails here without a message, and the loader then
 * reads the whole file through the JSON reader, which accepts or refuses it with the usual messages. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "tokenizer/tokenizer_internal.h"
#include "util/json.h"

typedef struct cursor {
    const char *text;
    size_t length, pos;
} cursor;

static void skip_space(cursor *c) {
    while (c->pos < c->length) {
        char ch = c->text[c->pos];
        if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r') break;
        c->pos++;
    }
}

static bool take(cursor *c, char ch) {
    skip_space(c);
    if (c->pos >= c->length || c->text[c->pos] != ch) return false;
    c->pos++;
    return true;
}

/* The bytes of the character at s[i] inside a string (not a quote or backslash), 0 where the JSON reader
 * refuses it: a control byte or invalid UTF-8. Two-byte sequences, most of a byte-level vocab, are checked
 * here; longer ones by the JSON reader's own rule. */
static inline size_t utf8_length(const unsigned char *s, size_t n, size_t i) {
    unsigned char ch = s[i];
    if (ch >= 0x20 && ch < 0x80) return 1;
    if (ch >= 0xC2 && ch <= 0xDF) return i + 1 < n && (s[i + 1] & 0xC0) == 0x80 ? 2 : 0;
    if (ch < 0x80) return 0;
    return json_utf8_sequence_length((const char *)s + i, n - i);
}

/* A string as written, escapes left in (the quote that ends it is the first not escaped). */
static bool read_raw_string(cursor *c, const char **body, size_t *length) {
    skip_space(c);
    if (c->pos >= c->length || c->text[c->pos] != '"') return false;
    size_t from = c->pos + 1;
    for (;;) {
        const char *quote = memchr(c->text + from, '"', c->length - from);
        if (!quote) return false;
        size_t at = (size_t)(quote - c->text), k = at;
        while (k > c->pos + 1 && c->text[k - 1] == '\\') k--;
        if ((at - k) % 2 == 0) {
            *body = c->text + c->pos + 1;
            *length = at - c->pos - 1;
            c->pos = at + 1;
            return true;
        }
        from = at + 1;
    }
}

/* A string's value: its text when it has no escape, or decoded into out->decoded when it has only the
 * one-character escapes (\" and \\ are common in byte-level vocabs). A \u escape fails. Control bytes and
 * invalid UTF-8 fail as the JSON reader refuses them. */
static bool read_string_value(cursor *c, model_text *out, const char **value, size_t *length) {
    skip_space(c);
    const unsigned char *s = (const unsigned char *)c->text;
    const size_t n = c->length;
    size_t i = c->pos;
    if (i >= n || s[i] != '"') return false;
    const size_t start = ++i;
    for (;;) {
        if (i >= n) return false;
        unsigned char ch = s[i];
        if (ch == '"') {
            *value = c->text + start;
            *length = i - start;
            c->pos = i + 1;
            return true;
        }
        if (ch == '\\') break;
        size_t k = utf8_length(s, n, i);
        if (k == 0) return false;
        i += k;
    }
    char *w = out->decoded + out->decoded_used, *begin = w;
    memcpy(w, c->text + start, i - start);
    w += i - start;
    for (;;) {
        if (i >= n) return false;
        unsigned char ch = s[i];
        if (ch == '"') break;
        if (ch == '\\') {
            if (i + 1 >= n) return false;
            switch (s[i + 1]) {
            case '"': *w++ = '"'; break;
            case '\\': *w++ = '\\'; break;
            case '/': *w++ = '/'; break;
            case 'b': *w++ = '\b'; break;
            case 'f': *w++ = '\f'; break;
            case 'n': *w++ = '\n'; break;
            case 'r': *w++ = '\r'; break;
            case 't': *w++ = '\t'; break;
            default: return false;
            }
            i += 2;
            continue;
        }
        size_t k = utf8_length(s, n, i);
        if (k == 0) return false;
        memcpy(w, c->text + i, k);
        w += k;
        i += k;
    }
    *value = begin;
    *length = (size_t)(w - begin);
    out->decoded_used += *length;
    c->pos = i + 1;
    return true;
}

/* Skips one value as far as strings and bracket depth go, stopping before the ',' or closing bracket after
 * it; the JSON reader checks its syntax later. */
static bool skip_value(cursor *c) {
    skip_space(c);
    size_t depth = 0;
    while (c->pos < c->length) {
        char ch = c->text[c->pos];
        if (ch == '"') {
            const char *body;
            size_t length;
            if (!read_raw_string(c, &body, &length)) return false;
            if (depth == 0) return true;
            continue;
        }
        if (ch == '{' || ch == '[') {
            depth++;
        } else if (ch == '}' || ch == ']') {
            if (depth == 0) return true;
            if (--depth == 0) {
                c->pos++;
                return true;
            }
        } else if (ch == ',' && depth == 0) {
            return true;
        }
        c->pos++;
    }
    return false;
}

/* A non-negative integer literal of at most nine digits, as JSON writes it (no leading zero). */
static bool read_small_integer(cursor *c, int64_t *out) {
    skip_space(c);
    size_t start = c->pos, end = start;
    while (end < c->length && end - start < 10 && c->text[end] >= '0' && c->text[end] <= '9') end++;
    size_t digits = end - start;
    if (digits == 0 || digits > 9 || (digits > 1 && c->text[start] == '0')) return false;
    if (end < c->length && (c->text[end] == '.' || c->text[end] == 'e' || c->text[end] == 'E')) return false;
    int64_t v = 0;
    for (size_t i = start; i < end; i++) v = v * 10 + (c->text[i] - '0');
    c->pos = end;
    *out = v;
    return true;
}

/* Room for every entry the rest of the text could hold (an entry takes at least min_bytes of it, and the
 * separator count, checked before, bounds them too), reserved at once: only the pages written are backed,
 * in huge pages where the kernel offers them, so the array never moves or grows. */
static void *reserve_entries(size_t remaining, size_t min_bytes, size_t size, size_t *bytes) {
    size_t bound = remaining / min_bytes + 1;
    if (bound > (size_t)TOKENIZER_JSON_MAX_SEPARATORS + 1) bound = (size_t)TOKENIZER_JSON_MAX_SEPARATORS + 1;
    *bytes = bound * size;
    void *p = mmap(NULL, *bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, *bytes, MADV_HUGEPAGE); /* a hint; without it only speed suffers */
#endif
    return p;
}

/* {"key": id, ...} from c->pos. */
static bool read_vocab(cursor *c, model_text *out) {
    if (!take(c, '{')) return false;
    /* "":0, is the least a member takes */
    out->vocab = reserve_entries(c->length - c->pos, 4, sizeof *out->vocab, &out->vocab_bytes);
    if (!out->vocab) return false;
    if (take(c, '}')) return true;
    do {
        vocab_item *e = &out->vocab[out->n_vocab];
        if (!read_string_value(c, out, &e->key, &e->key_length) || !take(c, ':') || !read_small_integer(c, &e->id))
            return false;
        out->n_vocab++;
    } while (take(c, ','));
    return take(c, '}');
}

/* ["a b", ...] or [["a", "b"], ...] from c->pos. */
static bool read_merges(cursor *c, model_text *out) {
    if (!take(c, '[')) return false;
    /* "a b", is the least a merge takes */
    out->merges = reserve_entries(c->length - c->pos, 5, sizeof *out->merges, &out->merges_bytes);
    if (!out->merges) return false;
    if (take(c, ']')) return true;
    do {
        merge_item *e = &out->merges[out->n_merges];
        memset(e, 0, sizeof *e);
        skip_space(c);
        if (c->pos < c->length && c->text[c->pos] == '[') {
            c->pos++;
            if (!read_string_value(c, out, &e->left, &e->left_length) || !take(c, ',') ||
                !read_string_value(c, out, &e->right, &e->right_length) || !take(c, ']'))
                return false;
        } else {
            const char *body;
            size_t length;
            if (!read_string_value(c, out, &body, &length)) return false;
            const char *space = memchr(body, ' ', length);
            if (!space || memchr(space + 1, ' ', length - (size_t)(space - body) - 1)) return false;
            e->left = body;
            e->left_length = (size_t)(space - body);
            e->right = space + 1;
            e->right_length = length - e->left_length - 1;
        }
        out->n_merges++;
    } while (take(c, ','));
    return take(c, ']');
}

/* Finds root.model.vocab and root.model.merges, reads them, and copies the rest of the text with "{}" and
 * "[]" in their places. */
static bool read_model(cursor *c, model_text *out, size_t vocab_span[2], size_t merges_span[2]) {
    if (!take(c, '{')) return false;
    bool seen_model = false;
    if (take(c, '}')) return false;
    do {
        const char *key;
        size_t key_length;
        if (!read_raw_string(c, &key, &key_length) || !take(c, ':')) return false;
        skip_space(c);
        if (key_length == 5 && memcmp(key, "model", 5) == 0 && c->pos < c->length && c->text[c->pos] == '{') {
            if (seen_model) return false;
            seen_model = true;
            c->pos++;
            if (take(c, '}')) return false;
            do {
                const char *member;
                size_t member_length;
                if (!read_raw_string(c, &member, &member_length) || !take(c, ':')) return false;
                skip_space(c);
                size_t start = c->pos;
                if (member_length == 5 && memcmp(member, "vocab", 5) == 0) {
                    if (vocab_span[1] || !read_vocab(c, out)) return false;
                    vocab_span[0] = start;
                    vocab_span[1] = c->pos;
                } else if (member_length == 6 && memcmp(member, "merges", 6) == 0) {
                    if (merges_span[1] || !read_merges(c, out)) return false;
                    merges_span[0] = start;
                    merges_span[1] = c->pos;
                } else if (!skip_value(c)) {
                    return false;
                }
            } while (take(c, ','));
            if (!take(c, '}')) return false;
        } else if (!skip_value(c)) {
            return false;
        }
    } while (take(c, ','));
    return take(c, '}') && vocab_span[1] && merges_span[1];
}

bool model_text_read(const char *text, size_t length, model_text *out) {
    memset(out, 0, sizeof *out);
    cursor c = {text, length, 0};
    out->decoded = malloc(length + 1); /* decoded strings are never longer than their text */
    if (!out->decoded) return false;
    size_t vocab_span[2] = {0, 0}, merges_span[2] = {0, 0};
    if (!read_model(&c, out, vocab_span, merges_span)) {
        model_text_free(out);
        return false;
    }
    size_t first[2], second[2];
    const char *first_stub = vocab_span[0] < merges_span[0] ? "{}" : "[]";
    const char *second_stub = vocab_span[0] < merges_span[0] ? "[]" : "{}";
    memcpy(first, vocab_span[0] < merges_span[0] ? vocab_span : merges_span, sizeof first);
    memcpy(second, vocab_span[0] < merges_span[0] ? merges_span : vocab_span, sizeof second);
    size_t kept = length - (first[1] - first[0]) - (second[1] - second[0]);
    out->rest = malloc(kept + 4);
    if (!out->rest) {
        model_text_free(out);
        return false;
    }
    char *w = out->rest;
    memcpy(w, text, first[0]);
    w += first[0];
    memcpy(w, first_stub, 2);
    w += 2;
    memcpy(w, text + first[1], second[0] - first[1]);
    w += second[0] - first[1];
    memcpy(w, second_stub, 2);
    w += 2;
    memcpy(w, text + second[1], length - second[1]);
    w += length - second[1];
    out->rest_length = (size_t)(w - out->rest);
    return true;
}

void model_text_free(model_text *m) {
    if (m->vocab) (void)munmap(m->vocab, m->vocab_bytes);
    if (m->merges) (void)munmap(m->merges, m->merges_bytes);
    free(m->rest);
    free(m->decoded);
    memset(m, 0, sizeof *m);
}

/* Ids back to text: whole sequences (tokenizer_decode) and token by token during generation. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer_internal.h"
#include "util/error.h"

static kite_status check_id(const tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_ids || t->id_kind[id] == 0)
        return kite_fail(KITE_ERROR_INVALID_INPUT, "tokenizer: token id %d is not in the vocabulary (size %d)", id,
                         t->n_ids);
    return KITE_OK;
}

kite_status tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *length) {
    if (!t || !text || (!ids && n > 0)) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "tokenizer_decode: NULL argument");
    *text = NULL;
    if (length) *length = 0;
    size_t raw_length = 0;
    for (size_t i = 0; i < n; i++) {
        KITE_TRY(check_id(t, ids[i]));
        raw_length += t->offsets[ids[i] + 1] - t->offsets[ids[i]];
    }
    /* Token bytes first, then one lossy UTF-8 pass over all of them: a character split across tokens
     * must come out whole, as Hugging Face's decoder joins before converting. */
    char *raw = malloc(raw_length + 1);
    if (!raw) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "tokenizer_decode: out of memory");
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t start = t->offsets[ids[i]], end = t->offsets[ids[i] + 1];
        memcpy(raw + at, t->blob + start, end - start);
        at += end - start;
    }
    char *out = NULL;
    size_t out_length = 0, capacity = 0;
    kite_status status = utf8_append_lossy(&out, &out_length, &capacity, raw, raw_length);
    free(raw);
    if (status != KITE_OK) {
        free(out);
        return status;
    }
    if (!out) {
        out = malloc(1);
        if (!out) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "tokenizer_decode: out of memory");
        out[0] = '\0';
    }
    *text = out;
    if (length) *length = out_length;
    return KITE_OK;
}

struct detokenizer {
    const tokenizer *t;
    unsigned char pending[4]; /* the start of a UTF-8 sequence still waiting for its last bytes */
    size_t n_pending;
    char *scratch;            /* pending bytes + the new token's bytes */
    size_t scratch_capacity;
    char *text;               /* what the last call returned */
    size_t text_capacity;
};

kite_status detokenizer_create(const tokenizer *t, detokenizer **out) {
    if (!t || !out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "detokenizer_create: NULL argument");
    detokenizer *d = calloc(1, sizeof *d);
    if (!d) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "detokenizer_create: out of memory");
    d->t = t;
    *out = d;
    return KITE_OK;
}

void detokenizer_free(detokenizer *d) {
    if (!d) return;
    free(d->scratch);
    free(d->text);
    free(d);
}

/* How many bytes at the end of s form a valid but unfinished UTF-8 sequence (0..3). Those are held back:
 * the next token may complete them, and a lossy conversion now would emit U+FFFD too early. */
static size_t incomplete_tail(const unsigned char *s, size_t n) {
    size_t max_back = n < 3 ? n : 3;
    for (size_t back = 1; back <= max_back; back++) {
        unsigned char c = s[n - back];
        if ((c & 0xC0) == 0x80) continue; /* a continuation byte: the lead is further back */
        if (c < 0xC2 || c > 0xF4) return 0;
        size_t subpart;
        size_t complete = utf8_sequence_check(s + n - back, back, &subpart);
        /* A valid prefix cut short by the end of the buffer covers every byte that is there. */
        if (complete == 0 && subpart == back) {
            size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            if (back < need) return back;
        }
        return 0;
    }
    return 0;
}

kite_status detokenizer_push(detokenizer *d, int32_t id, const char **text, size_t *length) {
    if (!d || !text || !length) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "detokenizer_push: NULL argument");
    *text = "";
    *length = 0;
    KITE_TRY(check_id(d->t, id));
    uint32_t start = d->t->offsets[id], end = d->t->offsets[id + 1];
    size_t n = d->n_pending + (end - start);
    if (n + 1 > d->scratch_capacity) {
        size_t cap = d->scratch_capacity ? d->scratch_capacity : 64;
        while (cap < n + 1) cap *= 2;
        char *grown = realloc(d->scratch, cap);
        if (!grown) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "detokenizer_push: out of memory");
        d->scratch = grown;
        d->scratch_capacity = cap;
    }
    memcpy(d->scratch, d->pending, d->n_pending);
    memcpy(d->scratch + d->n_pending, d->t->blob + start, end - start);
    size_t hold = incomplete_tail((const unsigned char *)d->scratch, n);
    size_t out_length = 0;
    KITE_TRY(utf8_append_lossy(&d->text, &out_length, &d->text_capacity, d->scratch, n - hold));
    memcpy(d->pending, d->scratch + n - hold, hold);
    d->n_pending = hold;
    *text = d->text ? d->text : "";
    *length = out_length;
    return KITE_OK;
}

kite_status detokenizer_flush(detokenizer *d, const char **text, size_t *length) {
    if (!d || !text || !length) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "detokenizer_flush: NULL argument");
    size_t out_length = 0;
    KITE_TRY(utf8_append_lossy(&d->text, &out_length, &d->text_capacity, (const char *)d->pending, d->n_pending));
    d->n_pending = 0;
    *text = d->text ? d->text : "";
    *length = out_length;
    return KITE_OK;
}

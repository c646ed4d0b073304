/* Loading tokenizer.json / tokenizer_config.json, and encode: added tokens first, then normalize, split
 * and merge what lies between them. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <utf8proc.h>

#include "tokenizer/tokenizer_internal.h"
#include "util/error.h"
#include "util/file.h"
#include "util/json.h"
#include "util/json_scan.h"

/* GPT-2's split pattern, which Hugging Face's ByteLevel pre-tokenizer applies when use_regex is true. */
static const char gpt2_split_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static atomic_uint_fast64_t next_generation = 1;

/* ---- small helpers -------------------------------------------------------------------------------- */

static size_t next_power_of_two(size_t n) {
    size_t p = 1;
    while (p < n) p <<= 1;
    return p;
}

/* The hash tables are large (megabytes) and filled in random order: faulting their pages in one by one
 * cost more than filling them. Huge pages, where the kernel offers them, cut the faults 512-fold. */
static void *table_alloc(size_t size) {
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, size, MADV_HUGEPAGE); /* a hint; without it only speed suffers */
#endif
    return p; /* zero-filled */
}

static void table_free(void *p, size_t size) {
    if (p) (void)munmap(p, size);
}

static bool json_string_is(const json_value *v, const char *s) {
    return json_is_string(v) && strcmp(v->as.string, s) == 0;
}

/* A member that must be absent, null, or equal to one of the accepted "no effect" values. */
static bool json_null_or_absent(const json_value *v) { return !v || json_is_null(v); }

static kite_status get_flag(const json_value *object, const char *key, bool fallback, bool *out, const char *path,
                            const char *where) {
    const json_value *v = json_object_member(object, key);
    if (json_null_or_absent(v)) {
        *out = fallback;
        return KITE_OK;
    }
    if (!json_get_bool(v, out))
        return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: %s.%s: expected true or false, found %s", path, where, key,
                         json_type_name(v->type));
    return KITE_OK;
}

static const char *type_of(const json_value *object) {
    const json_value *v = json_object_member(object, "type");
    return json_is_string(v) ? v->as.string : NULL;
}

/* ---- added-token matcher -------------------------------------------------------------------------- */

static int compare_added(const void *a, const void *b) {
    const added_token *x = *(const added_token *const *)a, *y = *(const added_token *const *)b;
    unsigned char fx = (unsigned char)x->content[0], fy = (unsigned char)y->content[0];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (x->length != y->length) return x->length > y->length ? -1 : 1; /* longest first */
    return x->id < y->id ? -1 : (x->id > y->id);
}

static kite_status matcher_build(added_matcher *m, const tokenizer *t, bool normalized) {
    memset(m, 0, sizeof *m);
    m->single_first_byte = -1;
    size_t count = 0;
    for (size_t i = 0; i < t->n_added; i++) count += t->added[i].normalized == normalized;
    if (count == 0) return KITE_OK;
    m->tokens = malloc(count * sizeof *m->tokens);
    if (!m->tokens) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory for added tokens");
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized) m->tokens[m->count++] = &t->added[i];
    qsort(m->tokens, m->count, sizeof *m->tokens, compare_added);
    size_t k = 0;
    for (int b = 0; b < 256; b++) {
        m->first[b] = (uint32_t)k;
        while (k < m->count && (unsigned char)m->tokens[k]->content[0] == b) k++;
    }
    m->first[256] = (uint32_t)k;
    unsigned char b0 = (unsigned char)m->tokens[0]->content[0];
    if ((unsigned char)m->tokens[m->count - 1]->content[0] == b0) m->single_first_byte = b0;
    return KITE_OK;
}

/* The leftmost match at or after `from`, the longest among those starting there (Aho-Corasick's
 * leftmost-longest). */
static const added_token *matcher_next(const added_matcher *m, const char *text, size_t length, size_t from,
                                       size_t *start) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = from;
    while (i < length) {
        if (m->single_first_byte >= 0) {
            const void *hit = memchr(s + i, m->single_first_byte, length - i);
            if (!hit) return NULL;
            i = (size_t)((const unsigned char *)hit - s);
        }
        unsigned char b = s[i];
        for (uint32_t k = m->first[b]; k < m->first[b + 1]; k++) {
            const added_token *tok = m->tokens[k];
            if (tok->length <= length - i && memcmp(s + i, tok->content, tok->length) == 0) {
                *start = i;
                return tok;
            }
        }
        i++;
    }
    return NULL;
}

/* Character classes as Rust's char methods define them, used by the lstrip / rstrip / single_word flags. */
static bool code_point_is_whitespace(int32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static bool code_point_is_word(int32_t c) {
    if (c == '_') return true;
    utf8proc_category_t cat = utf8proc_category(c);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
           (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

/* The code point ending just before `end` (text is valid UTF-8); its start in *begin. */
static int32_t code_point_before(const char *text, size_t end, size_t *begin) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)text[i] & 0xC0) == 0x80) i--;
    utf8proc_int32_t c = -1;
    (void)utf8proc_iterate((const utf8proc_uint8_t *)text + i, (utf8proc_ssize_t)(end - i), &c);
    *begin = i;
    return c;
}

static int32_t code_point_at(const char *text, size_t length, size_t at, size_t *size) {
    utf8proc_int32_t c = -1;
    utf8proc_ssize_t n = utf8proc_iterate((const utf8proc_uint8_t *)text + at, (utf8proc_ssize_t)(length - at), &c);
    *size = n > 0 ? (size_t)n : 1;
    return c;
}

/* One stretch of text: an added token (id >= 0) or text to normalize and split (id < 0). */
typedef struct segment {
    int32_t id;
    size_t start, end;
} segment;

typedef struct segment_list {
    segment *items;
    size_t count, capacity;
} segment_list;

static kite_status segment_push(segment_list *l, int32_t id, size_t start, size_t end) {
    if (l->count == l->capacity) {
        size_t cap = l->capacity ? l->capacity * 2 : 16;
        segment *grown = realloc(l->items, cap * sizeof *grown);
        if (!grown) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory splitting added tokens");
        l->items = grown;
        l->capacity = cap;
    }
    l->items[l->count++] = (segment){id, start, end};
    return KITE_OK;
}

/* Hugging Face's AddedVocabulary::find_matches: matches, with single_word / lstrip / rstrip applied, and
 * the text between them. */
static kite_status split_added(const added_matcher *m, const char *text, size_t length, segment_list *out) {
    size_t offset = 0, from = 0;
    size_t start;
    const added_token *tok;
    while (m->count > 0 && (tok = matcher_next(m, text, length, from, &start)) != NULL) {
        size_t stop = start + tok->length;
        from = stop;
        if (tok->single_word) {
            size_t begin, size;
            bool word_before = start > 0 && code_point_is_word(code_point_before(text, start, &begin));
            bool word_after = stop < length && code_point_is_word(code_point_at(text, length, stop, &size));
            if (word_before || word_after) continue;
        }
        if (tok->lstrip) {
            size_t s = start, begin;
            while (s > 0 && code_point_is_whitespace(code_point_before(text, s, &begin))) s = begin;
            start = s > offset ? s : offset; /* spaces an earlier match already took stay with it */
        }
        if (tok->rstrip) {
            size_t size;
            while (stop < length && code_point_is_whitespace(code_point_at(text, length, stop, &size))) stop += size;
        }
        if (offset < start) KITE_TRY(segment_push(out, -1, offset, start));
        KITE_TRY(segment_push(out, tok->id, start, stop));
        offset = stop;
        if (from < stop) from = stop;
    }
    if (offset < length) KITE_TRY(segment_push(out, -1, offset, length));
    return KITE_OK;
}

/* ---- encode --------------------------------------------------------------------------------------- */

typedef struct encode_state {
    const tokenizer *t;
    id_buffer *out;
} encode_state;

static kite_status encode_piece(void *user, const char *piece, size_t length) {
    encode_state *s = user;
    return bpe_encode_piece(s->t, piece, length, s->out);
}

static kite_status encode_normalized(const tokenizer *t, const char *text, size_t length, id_buffer *out) {
    encode_state state = {t, out};
    if (t->normalized_matcher.count == 0) return pretokenize_split(t, text, length, encode_piece, &state);
    segment_list segments = {0};
    kite_status status = split_added(&t->normalized_matcher, text, length, &segments);
    for (size_t i = 0; status == KITE_OK && i < segments.count; i++) {
        const segment *g = &segments.items[i];
        if (g->id >= 0)
            status = id_buffer_push(out, g->id);
        else
            status = pretokenize_split(t, text + g->start, g->end - g->start, encode_piece, &state);
    }
    free(segments.items);
    return status;
}

static kite_status encode_text(const tokenizer *t, const char *text, size_t length, id_buffer *out) {
    char *normalized = NULL;
    size_t normalized_length = 0;
    KITE_TRY(pretokenize_normalize(t, text, length, &normalized, &normalized_length));
    kite_status status = normalized ? encode_normalized(t, normalized, normalized_length, out)
                                    : encode_normalized(t, text, length, out);
    free(normalized);
    return status;
}

kite_status tokenizer_encode(const tokenizer *t, const char *text, size_t length, int32_t **ids, size_t *n_ids) {
    if (!t || !ids || !n_ids || (!text && length > 0))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "tokenizer_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    char *repaired = NULL;
    size_t repaired_length = 0;
    KITE_TRY(utf8_repair(text, length, &repaired, &repaired_length));
    if (repaired) {
        text = repaired;
        length = repaired_length;
    }
    id_buffer out = {0};
    kite_status status = id_buffer_reserve(&out, length / 3 + 16);
    segment_list segments = {0};
    if (status == KITE_OK) status = split_added(&t->raw_matcher, text, length, &segments);
    for (size_t i = 0; status == KITE_OK && i < segments.count; i++) {
        const segment *g = &segments.items[i];
        if (g->id >= 0)
            status = id_buffer_push(&out, g->id);
        else
            status = encode_text(t, text + g->start, g->end - g->start, &out);
    }
    free(segments.items);
    free(repaired);
    if (status != KITE_OK || out.count == 0) {
        free(out.ids);
        return status;
    }
    *ids = out.ids;
    *n_ids = out.count;
    return KITE_OK;
}

/* ---- lookups -------------------------------------------------------------------------------------- */

int32_t tokenizer_vocab_size(const tokenizer *t) { return t ? t->n_ids : 0; }

int32_t tokenizer_token_to_id(const tokenizer *t, const char *token) {
    if (!t || !token) return -1;
    size_t length = strlen(token);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].length == length && memcmp(t->added[i].content, token, length) == 0) return t->added[i].id;
    if (length > 0) {
        char stack[256];
        char *bytes = length <= sizeof stack ? stack : malloc(length);
        if (bytes) {
            size_t n = 0;
            int32_t id = -1;
            if (byte_level_decode(token, length, bytes, &n)) {
                id = bytes_map_find(t, bytes, n);
            }
            if (bytes != stack) free(bytes);
            if (id >= 0) return id;
        }
    }
    for (size_t i = 0; i < t->n_odd; i++)
        if (strcmp(t->odd_strings[i], token) == 0) return t->odd_ids[i];
    return -1;
}

const char *tokenizer_token_bytes(const tokenizer *t, int32_t id, size_t *length) {
    if (!t || id < 0 || id >= t->n_ids || t->id_kind[id] == 0) return NULL;
    if (length) *length = t->offsets[id + 1] - t->offsets[id];
    return t->blob + t->offsets[id];
}

bool tokenizer_is_special(const tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_ids && t->id_kind[id] == 3;
}

int32_t tokenizer_eos_id(const tokenizer *t) { return t ? t->eos_id : -1; }
int32_t tokenizer_bos_id(const tokenizer *t) { return t ? t->bos_id : -1; }
bool tokenizer_add_bos(const tokenizer *t) { return t && t->add_bos; }

/* ---- free ----------------------------------------------------------------------------------------- */

void tokenizer_free(tokenizer *t) {
    if (!t) return;
    free(t->blob);
    free(t->offsets);
    free(t->id_kind);
    table_free(t->vocab.slots, (t->vocab.mask + 1) * sizeof *t->vocab.slots);
    table_free(t->merges.entries, (t->merges.mask + 1) * sizeof *t->merges.entries);
    free(t->added);
    free(t->added_strings);
    free(t->raw_matcher.tokens);
    free(t->normalized_matcher.tokens);
    for (size_t i = 0; i < t->n_odd; i++) free(t->odd_strings[i]);
    free(t->odd_strings);
    free(t->odd_ids);
    for (size_t i = 0; i < t->n_splits; i++) pcre2_code_free(t->splits[i]);
    free(t);
}

/* ---- load: model ---------------------------------------------------------------------------------- */

/* Checks the BPE options kite implements; anything else is named in the error. */
static kite_status load_model_options(tokenizer *t, const json_value *model, const char *path) {
    const char *type = type_of(model);
    const json_value *type_value = json_object_member(model, "type");
    if (type_value && !type)
        return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: model.type: expected a string", path);
    if (type && strcmp(type, "BPE") != 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: model.type \"%s\" is not supported (kite implements BPE)", path,
                         type);
    const json_value *dropout = json_object_member(model, "dropout");
    double dropout_value = 0;
    if (!json_null_or_absent(dropout) && (!json_get_double(dropout, &dropout_value) || dropout_value != 0))
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: model.dropout is not supported (must be null)", path);
    if (!json_null_or_absent(json_object_member(model, "unk_token")))
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: model.unk_token is not supported (must be null)", path);
    static const char *const empty_strings[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        const json_value *v = json_object_member(model, empty_strings[i]);
        if (!json_null_or_absent(v) && !json_string_is(v, ""))
            return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: model.%s is not supported (must be empty)", path,
                             empty_strings[i]);
    }
    bool byte_fallback = false, fuse_unk = false;
    KITE_TRY(get_flag(model, "byte_fallback", false, &byte_fallback, path, "model"));
    if (byte_fallback) return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: model.byte_fallback true is not supported", path);
    KITE_TRY(get_flag(model, "fuse_unk", false, &fuse_unk, path, "model")); /* no effect without unk_token */
    KITE_TRY(get_flag(model, "ignore_merges", false, &t->ignore_merges, path, "model"));
    return KITE_OK;
}

typedef struct added_spec {
    int64_t id;
    const json_value *object;
    const json_value *content;
} added_spec;

/* The bound on token ids for a file of n_tokens tokens (vocab plus added). Real vocabularies are dense
 * (ids 0 .. n-1, added tokens right after, a few reserved gaps): twice the tokens plus 65536 spare ids
 * leaves room for any gaps they have while keeping the tables in proportion to the file. Below
 * INT32_MAX - 1 always, since ids are int32 and n_ids + 1 must fit. */
static int64_t tokenizer_id_limit(size_t n_tokens) {
    uint64_t limit = 2 * (uint64_t)n_tokens + 65536;
    return limit < (uint64_t)INT32_MAX - 1 ? (int64_t)limit : (int64_t)INT32_MAX - 1;
}

/* A status that falls back to the JSON reader without a message: the plain-form reading (model_text.c)
 * cannot tell that its keys are distinct in a case the JSON reader decides. */
#define VOCAB_KEYS_UNCHECKED KITE_ERROR_UNSUPPORTED

/* Odd (not byte-level) vocab strings compared pairwise when the JSON reader has not checked the keys. */
enum { ODD_STRINGS_UNCHECKED_MAX = 64 };

/* Vocab and added tokens: ids, what each decodes to, the byte-string map. keys_distinct: the JSON reader has
 * refused repeated keys; otherwise a repeat is found here or the load returns VOCAB_KEYS_UNCHECKED. */
static kite_status load_vocab(tokenizer *t, const vocab_item *vocab, size_t n_vocab, bool keys_distinct,
                              const json_value *added_tokens, const char *path) {
    size_t n_added = 0;
    if (!json_null_or_absent(added_tokens)) {
        if (!json_is_array(added_tokens))
            return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: added_tokens: expected an array", path);
        n_added = added_tokens->length;
    }

    /* Ids first, to size the tables. The tables have one row per id up to the largest, so every id is held
     * to a bound set by the number of tokens given before anything is sized by it: an id far past them
     * (200000000 in a file of 151669 tokens) would cost gigabytes of rows that are all empty. */
    const int64_t id_limit = tokenizer_id_limit(n_vocab + n_added);
    int64_t max_id = -1;
    for (size_t i = 0; i < n_vocab; i++) {
        const vocab_item *m = &vocab[i];
        int64_t id = m->id;
        if (id < 0 || id >= id_limit)
            return kite_fail(KITE_ERROR_INVALID_TOKENIZER,
                             "%s: model.vocab[\"%.*s\"]: expected an id in [0, %lld) for %zu tokens", path,
                             (int)m->key_length, m->key, (long long)id_limit, n_vocab + n_added);
        if (id > max_id) max_id = id;
    }
    added_spec *specs = NULL;
    if (n_added) {
        specs = calloc(n_added, sizeof *specs);
        if (!specs) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    kite_status status = KITE_OK;
    size_t added_bytes = 0;
    for (size_t i = 0; i < n_added; i++) {
        const json_value *a = &added_tokens->as.items[i];
        const json_value *id_value = json_object_member(a, "id");
        const json_value *content = json_object_member(a, "content");
        int64_t id;
        if (!json_is_object(a) || !json_get_int64(id_value, &id)) {
            status = kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: added_tokens[%zu]: expected an object with an id", path, i);
            goto fail;
        }
        if (id < 0 || id >= id_limit) {
            status = kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: added_tokens[%zu].id: %lld is not in [0, %lld) for %zu tokens",
                               path, i, (long long)id, (long long)id_limit, n_vocab + n_added);
            goto fail;
        }
        if (!json_is_string(content) || content->length == 0) {
            status = kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: added_tokens[%zu]: content must be a non-empty string",
                               path, i);
            goto fail;
        }
        specs[i] = (added_spec){id, a, content};
        added_bytes += content->length + 1;
        if (id > max_id) max_id = id;
    }

    size_t n_ids = (size_t)max_id + 1;
    t->n_ids = (int32_t)n_ids;
    t->id_kind = calloc(n_ids, 1);
    t->offsets = calloc(n_ids + 1, sizeof *t->offsets);
    uint32_t *lengths = calloc(n_ids, sizeof *lengths);
    const char **sources = calloc(n_ids, sizeof *sources); /* per id: its vocab string or added content */
    size_t *source_lengths = calloc(n_ids, sizeof *source_lengths);
    t->added = n_added ? calloc(n_added, sizeof *t->added) : NULL;
    t->added_strings = n_added ? malloc(added_bytes) : NULL;
    if (!t->id_kind || !t->offsets || !lengths || !sources || !source_lengths || (n_added && (!t->added || !t->added_strings))) {
        status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory for the vocab", path);
        goto fail_tables;
    }
    for (size_t i = 0; i < n_vocab; i++) {
        const vocab_item *m = &vocab[i];
        size_t id = (size_t)m->id;
        if (t->id_kind[id]) {
            status = kite_fail(KITE_ERROR_INVALID_TOKENIZER,
                               "%s: model.vocab: id %zu is given to both \"%.*s\" and \"%.*s\"", path, id,
                               (int)source_lengths[id], sources[id], (int)m->key_length, m->key);
            goto fail_tables;
        }
        t->id_kind[id] = 1;
        sources[id] = m->key;
        source_lengths[id] = m->key_length;
    }
    size_t added_used = 0;
    for (size_t i = 0; i < n_added; i++) {
        added_token *a = &t->added[i];
        const json_value *o = specs[i].object;
        a->id = (int32_t)specs[i].id;
        for (size_t j = 0; j < i; j++) {
            if (t->added[j].id == a->id) {
                status = kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: added_tokens[%zu]: id %d is used twice", path, i,
                                   a->id);
                goto fail_tables;
            }
        }
        char *content = t->added_strings + added_used;
        memcpy(content, specs[i].content->as.string, specs[i].content->length + 1);
        added_used += specs[i].content->length + 1;
        a->content = content;
        a->length = specs[i].content->length;
        if ((status = get_flag(o, "special", false, &a->special, path, "added_tokens[]")) != KITE_OK ||
            (status = get_flag(o, "lstrip", false, &a->lstrip, path, "added_tokens[]")) != KITE_OK ||
            (status = get_flag(o, "rstrip", false, &a->rstrip, path, "added_tokens[]")) != KITE_OK ||
            (status = get_flag(o, "single_word", false, &a->single_word, path, "added_tokens[]")) != KITE_OK ||
            (status = get_flag(o, "normalized", !a->special, &a->normalized, path, "added_tokens[]")) != KITE_OK)
            goto fail_tables;
        /* An added token that names a vocab token keeps it; its content is what decode gives. Then the map
         * no longer holds that vocab string, so a repeat of it would go unseen without the JSON reader. */
        if (!keys_distinct && t->id_kind[a->id] == 1) {
            status = VOCAB_KEYS_UNCHECKED;
            goto fail_tables;
        }
        t->id_kind[a->id] = a->special ? 3 : 2;
        sources[a->id] = a->content;
        source_lengths[a->id] = a->length;
    }
    t->n_added = n_added;

    /* What each id decodes to: Hugging Face's ByteLevel decoder maps a token whose characters are all
     * byte-level symbols to those bytes, and passes any other token through as its UTF-8. */
    size_t blob_size = 0;
    for (size_t id = 0; id < n_ids; id++) blob_size += source_lengths[id];
    if (blob_size >= UINT32_MAX) {
        status = kite_fail(KITE_ERROR_UNSUPPORTED, "%s: the vocab is too large", path);
        goto fail_tables;
    }
    t->blob = malloc(blob_size + 1);
    if (!t->blob) {
        status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory for the vocab", path);
        goto fail_tables;
    }
    size_t n_odd = 0;
    uint32_t at = 0;
    for (size_t id = 0; id < n_ids; id++) {
        t->offsets[id] = at;
        if (!t->id_kind[id]) continue;
        size_t n = 0;
        if (byte_level_decode(sources[id], source_lengths[id], t->blob + at, &n)) {
            lengths[id] = (uint32_t)n;
        } else {
            memcpy(t->blob + at, sources[id], source_lengths[id]);
            lengths[id] = (uint32_t)source_lengths[id];
            if (t->id_kind[id] == 1) {
                n_odd++;
                lengths[id] |= 0x80000000u; /* marks a vocab string that is not byte-level */
            }
        }
        at += lengths[id] & 0x7FFFFFFFu;
    }
    t->offsets[n_ids] = at;

    /* Byte string -> model id. */
    size_t capacity = next_power_of_two(n_vocab * 2 + 16);
    t->vocab.slots = table_alloc(capacity * sizeof *t->vocab.slots);
    if (t->vocab.slots) t->vocab.mask = capacity - 1;
    if (!keys_distinct && n_odd > ODD_STRINGS_UNCHECKED_MAX) {
        status = VOCAB_KEYS_UNCHECKED;
        goto fail_tables;
    }
    if (n_odd) {
        t->odd_strings = calloc(n_odd, sizeof *t->odd_strings);
        t->odd_ids = calloc(n_odd, sizeof *t->odd_ids);
    }
    if (!t->vocab.slots || (n_odd && (!t->odd_strings || !t->odd_ids))) {
        status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory for the vocab", path);
        goto fail_tables;
    }
    memset(t->vocab.slots, 0xFF, capacity * sizeof *t->vocab.slots);
    t->vocab.mask = capacity - 1;
    for (size_t i = 0; i < n_vocab; i++) {
        int32_t id = (int32_t)vocab[i].id;
        if (lengths[id] & 0x80000000u) {
            if (!keys_distinct) {
                for (size_t j = 0; j < t->n_odd; j++) {
                    if (strlen(t->odd_strings[j]) == vocab[i].key_length &&
                        memcmp(t->odd_strings[j], vocab[i].key, vocab[i].key_length) == 0) {
                        status = VOCAB_KEYS_UNCHECKED;
                        goto fail_tables;
                    }
                }
            }
            t->odd_strings[t->n_odd] = strndup(vocab[i].key, vocab[i].key_length);
            t->odd_ids[t->n_odd] = id;
            if (!t->odd_strings[t->n_odd]) {
                status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory for the vocab", path);
                goto fail_tables;
            }
            t->n_odd++;
            continue;
        }
        if (!bytes_map_insert(t, id)) {
            status = keys_distinct ? kite_fail(KITE_ERROR_INVALID_TOKENIZER,
                                               "%s: model.vocab: token \"%.*s\" is listed twice", path,
                                               (int)vocab[i].key_length, vocab[i].key)
                                   : VOCAB_KEYS_UNCHECKED;
            goto fail_tables;
        }
    }
    /* An added token that takes a vocab id with other content changes what the blob holds for it; the
     * map then finds that id under the added content's bytes, and merges naming the model's string fail
     * loudly at load. No published byte-level tokenizer does this. */

    uint32_t byte_to_char[256];
    byte_level_tables(byte_to_char);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        int32_t id = bytes_map_find(t, &c, 1);
        if (id < 0) {
            status = kite_fail(KITE_ERROR_UNSUPPORTED,
                               "%s: model.vocab has no token for byte 0x%02x (U+%04X): kite needs all 256 byte-level "
                               "symbols",
                               path, b, byte_to_char[b]);
            goto fail_tables;
        }
        t->byte_to_id[b] = id;
    }

fail_tables:
    free(lengths);
    free(sources);
    free(source_lengths);
fail:
    free(specs);
    return status;
}

/* Finds a merge side given as a vocab string; -1 when it is not in the vocab. */
static int32_t vocab_find_string(const tokenizer *t, const char *s, size_t length, char *scratch) {
    size_t n = 0;
    if (byte_level_decode(s, length, scratch, &n)) {
        return bytes_map_find(t, scratch, n);
    }
    for (size_t i = 0; i < t->n_odd; i++)
        if (strlen(t->odd_strings[i]) == length && memcmp(t->odd_strings[i], s, length) == 0) return t->odd_ids[i];
    return -1;
}

static kite_status load_merges(tokenizer *t, const merge_item *merges, size_t n, const char *path) {
    if (n >= UINT32_MAX) return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: model.merges: too many merges", path);
    size_t capacity = next_power_of_two(n * 2 + 16);
    t->merges.entries = table_alloc(capacity * sizeof *t->merges.entries);
    if (!t->merges.entries)
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory for merges", path);
    t->merges.mask = capacity - 1;

    char *scratch = NULL;
    size_t scratch_size = 0;
    kite_status status = KITE_OK;
    int32_t guess = -1;
    for (size_t rank = 0; rank < n; rank++) {
        const merge_item *m = &merges[rank];
        if (m->bad_pair) {
            status = kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: model.merges[%zu]: expected \"a b\", found \"%s\"",
                               path, rank, m->bad_pair);
            break;
        }
        if (m->bad_form) {
            status = kite_fail(KITE_ERROR_INVALID_TOKENIZER,
                               "%s: model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", path, rank);
            break;
        }
        const char *left = m->left, *right = m->right;
        size_t left_length = m->left_length, right_length = m->right_length;
        size_t need = left_length + right_length + 1;
        if (need > scratch_size) {
            free(scratch);
            scratch_size = need * 2 + 64;
            scratch = malloc(scratch_size * 2);
            if (!scratch) {
                status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory for merges", path);
                break;
            }
        }
        /* Both sides decoded once, side by side: their lookups and the merged token's check read the same
         * bytes. */
        char *joined = scratch + scratch_size;
        size_t left_bytes = 0, right_bytes = 0;
        const bool decoded = byte_level_decode(left, left_length, joined, &left_bytes) &&
                             byte_level_decode(right, right_length, joined + left_bytes, &right_bytes);
        int32_t left_id, right_id;
        if (decoded) {
            left_id = bytes_map_find(t, joined, left_bytes);
            right_id = bytes_map_find(t, joined + left_bytes, right_bytes);
        } else {
            left_id = vocab_find_string(t, left, left_length, scratch);
            right_id = vocab_find_string(t, right, right_length, scratch);
        }
        if (left_id < 0 || right_id < 0) {
            status = kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: model.merges[%zu]: token \"%.*s\" is not in the vocab",
                               path, rank, (int)(left_id < 0 ? left_length : right_length), left_id < 0 ? left : right);
            break;
        }
        /* Merged tokens usually follow the merges in id order (Qwen3: always id 256 + rank), so the id
         * after the previous merge's is tried first by comparing bytes, sparing a hash lookup. */
        int32_t merged = -1;
        if (decoded && guess >= 0 && guess < t->n_ids && t->id_kind[guess] == 1) {
            size_t n_bytes = left_bytes + right_bytes;
            if (t->offsets[guess + 1] - t->offsets[guess] == n_bytes &&
                memcmp(t->blob + t->offsets[guess], joined, n_bytes) == 0)
                merged = guess;
        }
        if (merged < 0) {
            memcpy(joined, left, left_length);
            memcpy(joined + left_length, right, right_length);
            merged = vocab_find_string(t, joined, left_length + right_length, scratch);
        }
        if (merged < 0) {
            status = kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: model.merges[%zu]: merged token \"%.*s%.*s\" is not in the vocab",
                               path, rank, (int)left_length, left, (int)right_length, right);
            break;
        }
        guess = merged + 1;
        /* A pair listed twice keeps its last rank, as Hugging Face's map insert does. */
        uint64_t key = ((uint64_t)(uint32_t)left_id << 32 | (uint32_t)right_id) + 1;
        size_t slot = (size_t)merge_hash(key) & t->merges.mask;
        while (t->merges.entries[slot].key != 0 && t->merges.entries[slot].key != key) slot = (slot + 1) & t->merges.mask;
        t->merges.entries[slot].key = key;
        t->merges.entries[slot].value = (uint64_t)rank << 32 | (uint32_t)merged;
    }
    free(scratch);
    return status;
}

/* model.vocab from the JSON reader's tree, as entries (which point into the tree). */
static kite_status vocab_items_from_json(const json_value *model, const char *path, vocab_item **out,
                                           size_t *count) {
    const json_value *vocab = json_object_member(model, "vocab");
    if (!vocab) return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: model.vocab is missing", path);
    if (!json_is_object(vocab))
        return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: model.vocab: expected an object, found %s", path,
                         json_type_name(vocab->type));
    if (vocab->length == 0) return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: model.vocab is empty", path);
    vocab_item *entries = malloc(vocab->length * sizeof *entries);
    if (!entries) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory for the vocab", path);
    for (size_t i = 0; i < vocab->length; i++) {
        const json_member *m = &vocab->as.members[i];
        int64_t id;
        entries[i] = (vocab_item){m->key, m->key_length, json_get_int64(&m->value, &id) ? id : -1};
    }
    *out = entries;
    *count = vocab->length;
    return KITE_OK;
}

/* model.merges from the JSON reader's tree; a merge of the wrong form is marked, for load_merges to name in
 * rank order. */
static kite_status merge_items_from_json(const json_value *model, const char *path, merge_item **out,
                                           size_t *count) {
    const json_value *merges = json_object_member(model, "merges");
    if (json_null_or_absent(merges)) return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: model.merges is missing", path);
    if (!json_is_array(merges))
        return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: model.merges: expected an array", path);
    *out = NULL;
    *count = 0;
    if (merges->length == 0) return KITE_OK;
    merge_item *entries = calloc(merges->length, sizeof *entries);
    if (!entries) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory for merges", path);
    for (size_t rank = 0; rank < merges->length; rank++) {
        const json_value *m = &merges->as.items[rank];
        merge_item *e = &entries[rank];
        if (json_is_string(m)) {
            const char *space = memchr(m->as.string, ' ', m->length);
            if (!space || memchr(space + 1, ' ', m->length - (size_t)(space - m->as.string) - 1)) {
                e->bad_pair = m->as.string;
                continue;
            }
            e->left = m->as.string;
            e->left_length = (size_t)(space - e->left);
            e->right = space + 1;
            e->right_length = m->length - e->left_length - 1;
        } else if (json_is_array(m) && m->length == 2 && json_is_string(&m->as.items[0]) &&
                   json_is_string(&m->as.items[1])) {
            e->left = m->as.items[0].as.string;
            e->left_length = m->as.items[0].length;
            e->right = m->as.items[1].as.string;
            e->right_length = m->as.items[1].length;
        } else {
            e->bad_form = true;
        }
    }
    *out = entries;
    *count = merges->length;
    return KITE_OK;
}

/* ---- load: pipeline ------------------------------------------------------------------------------- */

static kite_status load_normalizer(tokenizer *t, const json_value *normalizer, const char *path, const char *where) {
    if (json_null_or_absent(normalizer)) return KITE_OK;
    const char *type = type_of(normalizer);
    if (!type) return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: %s: expected an object with a type", path, where);
    if (strcmp(type, "NFC") == 0) {
        t->normalize_nfc = true;
        return KITE_OK;
    }
    if (strcmp(type, "Sequence") == 0) {
        const json_value *list = json_object_member(normalizer, "normalizers");
        if (!json_is_array(list))
            return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: %s.normalizers: expected an array", path, where);
        for (size_t i = 0; i < list->length; i++) KITE_TRY(load_normalizer(t, &list->as.items[i], path, where));
        return KITE_OK;
    }
    return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: %s type \"%s\" is not supported (kite implements NFC)", path, where,
                     type);
}

static kite_status load_byte_level_options(const json_value *v, const char *path, const char *where, bool *use_regex) {
    bool add_prefix_space = false;
    KITE_TRY(get_flag(v, "add_prefix_space", false, &add_prefix_space, path, where));
    if (add_prefix_space)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: %s.add_prefix_space true is not supported", path, where);
    if (use_regex) KITE_TRY(get_flag(v, "use_regex", true, use_regex, path, where));
    return KITE_OK;
}

static kite_status load_pre_tokenizer(tokenizer *t, const json_value *pre, const char *path) {
    if (json_null_or_absent(pre))
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: pre_tokenizer is null: kite needs a ByteLevel pre-tokenizer", path);
    const json_value *single = pre;
    const json_value *items = NULL;
    size_t count = 1;
    const char *type = type_of(pre);
    if (!type) return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: pre_tokenizer: expected an object with a type", path);
    if (strcmp(type, "Sequence") == 0) {
        const json_value *list = json_object_member(pre, "pretokenizers");
        if (!json_is_array(list))
            return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: pre_tokenizer.pretokenizers: expected an array", path);
        items = list->as.items;
        count = list->length;
    }
    bool byte_level_seen = false;
    for (size_t i = 0; i < count; i++) {
        const json_value *p = items ? &items[i] : single;
        const char *ptype = type_of(p);
        char where[64];
        snprintf(where, sizeof where, items ? "pre_tokenizer.pretokenizers[%zu]" : "pre_tokenizer", i);
        if (!ptype) return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: %s: expected an object with a type", path, where);
        if (byte_level_seen)
            return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: %s: a pre-tokenizer after ByteLevel is not supported", path,
                             where);
        if (strcmp(ptype, "Split") == 0) {
            const json_value *pattern = json_object_member(p, "pattern");
            const json_value *regex = json_object_member(pattern, "Regex");
            if (!json_is_object(pattern))
                return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: %s.pattern: expected an object", path, where);
            if (!json_is_string(regex))
                return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: %s.pattern: only a Regex pattern is supported", path, where);
            const json_value *behavior = json_object_member(p, "behavior");
            if (!json_string_is(behavior, "Isolated"))
                return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: %s.behavior \"%s\" is not supported (kite implements Isolated)",
                                 path, where, json_is_string(behavior) ? behavior->as.string : "?");
            bool invert = false;
            KITE_TRY(get_flag(p, "invert", false, &invert, path, where));
            if (invert) return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: %s.invert true is not supported", path, where);
            KITE_TRY(pretokenize_compile(t, regex->as.string, regex->length, where));
        } else if (strcmp(ptype, "ByteLevel") == 0) {
            bool use_regex = true;
            KITE_TRY(load_byte_level_options(p, path, where, &use_regex));
            if (use_regex) KITE_TRY(pretokenize_compile(t, gpt2_split_pattern, sizeof gpt2_split_pattern - 1, where));
            byte_level_seen = true;
        } else {
            return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: %s type \"%s\" is not supported (kite implements Split and ByteLevel)",
                             path, where, ptype);
        }
    }
    if (!byte_level_seen)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: pre_tokenizer has no ByteLevel step: kite implements byte-level BPE only",
                         path);
    return KITE_OK;
}

static kite_status load_decoder_and_post(const json_value *root, const char *path) {
    const json_value *decoder = json_object_member(root, "decoder");
    const char *type = json_null_or_absent(decoder) ? NULL : type_of(decoder);
    if (!type || strcmp(type, "ByteLevel") != 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: decoder %s%s%s is not supported (kite implements ByteLevel)", path,
                         type ? "type \"" : "", type ? type : "null", type ? "\"" : "");
    const json_value *post = json_object_member(root, "post_processor");
    if (!json_null_or_absent(post)) {
        const char *ptype = type_of(post);
        if (!ptype || strcmp(ptype, "ByteLevel") != 0)
            return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: post_processor type \"%s\" is not supported (kite implements ByteLevel or null)",
                             path, ptype ? ptype : "?");
    }
    /* Truncation and padding change what encode returns; kite leaves lengths to its caller. */
    if (!json_null_or_absent(json_object_member(root, "truncation")))
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: truncation is not supported (must be null)", path);
    if (!json_null_or_absent(json_object_member(root, "padding")))
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: padding is not supported (must be null)", path);
    return KITE_OK;
}

/* Parses json (the whole file, or the rest of it when `plain` holds its vocab and merges) and loads it. */
static kite_status load_document(const char *json, size_t length, const model_text *plain, const char *path,
                                 tokenizer **out) {
    json_error error;
    json_document *doc = json_parse(json, length, &error);
    if (!doc)
        return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s:%d:%d: %s", path, error.line, error.column, error.message);
    kite_status status = KITE_OK;
    tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        json_free(doc);
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    t->eos_id = -1;
    t->bos_id = -1;
    t->generation = atomic_fetch_add(&next_generation, 1);
    const json_value *root = json_root(doc);
    const json_value *model = json_object_member(root, "model");
    if (!json_is_object(root)) {
        status = kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: expected a JSON object at the top", path);
    } else if (!model) {
        status = kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: no \"model\" object", path);
    } else if (!json_is_object(model)) {
        status = kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: model: expected an object, found %s", path,
                           json_type_name(model->type));
    } else if (plain) {
        /* The rest holds "{}" and "[]" where the two were read; anything else means they were not found
         * where the JSON reader sees them. */
        const json_value *vocab = json_object_member(model, "vocab"), *merges = json_object_member(model, "merges");
        if (!json_is_object(vocab) || vocab->length != 0 || !json_is_array(merges) || merges->length != 0)
            status = VOCAB_KEYS_UNCHECKED;
    }
    if (status == KITE_OK) status = load_model_options(t, model, path);
    if (plain) {
        if (status == KITE_OK)
            status = load_vocab(t, plain->vocab, plain->n_vocab, false, json_object_member(root, "added_tokens"), path);
        if (status == KITE_OK) status = load_merges(t, plain->merges, plain->n_merges, path);
    } else {
        vocab_item *vocab = NULL;
        merge_item *merges = NULL;
        size_t n_vocab = 0, n_merges = 0;
        if (status == KITE_OK) status = vocab_items_from_json(model, path, &vocab, &n_vocab);
        if (status == KITE_OK)
            status = load_vocab(t, vocab, n_vocab, true, json_object_member(root, "added_tokens"), path);
        if (status == KITE_OK) status = merge_items_from_json(model, path, &merges, &n_merges);
        if (status == KITE_OK) status = load_merges(t, merges, n_merges, path);
        free(vocab);
        free(merges);
    }
    if (status == KITE_OK) status = load_normalizer(t, json_object_member(root, "normalizer"), path, "normalizer");
    if (status == KITE_OK) status = load_pre_tokenizer(t, json_object_member(root, "pre_tokenizer"), path);
    if (status == KITE_OK) status = load_decoder_and_post(root, path);
    if (status == KITE_OK) status = matcher_build(&t->raw_matcher, t, false);
    if (status == KITE_OK) status = matcher_build(&t->normalized_matcher, t, true);
    json_free(doc);
    if (status != KITE_OK) {
        tokenizer_free(t);
        return status;
    }
    *out = t;
    return KITE_OK;
}

kite_status tokenizer_load_json(const char *json, size_t length, const char *path, tokenizer **out) {
    if (!json || !out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "tokenizer_load_json: NULL argument");
    *out = NULL;
    if (!path) path = "tokenizer.json";
    size_t offset = 0;
    if (!json_scan_separators_within(json, length, TOKENIZER_JSON_MAX_SEPARATORS, &offset))
        return kite_fail(KITE_ERROR_INVALID_TOKENIZER,
                         "%s: byte %zu: more than %d commas and brackets (Qwen3's tokenizer.json has 606053)", path,
                         offset, TOKENIZER_JSON_MAX_SEPARATORS);
    /* The vocab and merges in their plain form first; a file that is not in it, or that fails to load that
     * way, is loaded again through the JSON reader alone, so what is accepted and every message stay the
     * JSON reader's. */
    model_text plain;
    if (model_text_read(json, length, &plain)) {
        tokenizer *t = NULL;
        kite_status status = load_document(plain.rest, plain.rest_length, &plain, path, &t);
        model_text_free(&plain);
        if (status == KITE_OK) {
            *out = t;
            return KITE_OK;
        }
    }
    return load_document(json, length, NULL, path, out);
}

/* ---- tokenizer_config.json ------------------------------------------------------------------------ */

/* A token given as a string or as {"content": "..."} (the AddedToken form). */
static kite_status config_token(const tokenizer *t, const json_value *root, const char *key, const char *path,
                                int32_t *out) {
    const json_value *v = json_object_member(root, key);
    if (json_null_or_absent(v)) return KITE_OK;
    if (json_is_object(v)) v = json_object_member(v, "content");
    if (!json_is_string(v))
        return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: %s: expected a string or an object with content", path, key);
    int32_t id = tokenizer_token_to_id(t, v->as.string);
    if (id < 0)
        return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: %s \"%s\" is not a token of tokenizer.json", path, key,
                         v->as.string);
    *out = id;
    return KITE_OK;
}

kite_status tokenizer_apply_config_json(tokenizer *t, const char *json, size_t length, const char *path) {
    if (!t || !json) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "tokenizer_apply_config_json: NULL argument");
    if (!path) path = "tokenizer_config.json";
    json_error error;
    json_document *doc = json_parse(json, length, &error);
    if (!doc)
        return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s:%d:%d: %s", path, error.line, error.column, error.message);
    const json_value *root = json_root(doc);
    kite_status status = KITE_OK;
    int32_t eos = t->eos_id, bos = t->bos_id;
    bool add_bos = t->add_bos;
    if (!json_is_object(root)) status = kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: expected a JSON object", path);
    if (status == KITE_OK) status = config_token(t, root, "eos_token", path, &eos);
    if (status == KITE_OK) status = config_token(t, root, "bos_token", path, &bos);
    if (status == KITE_OK) status = get_flag(root, "add_bos_token", false, &add_bos, path, "tokenizer_config");
    if (status == KITE_OK && add_bos && bos < 0)
        status = kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: add_bos_token is true but bos_token is not set", path);
    json_free(doc);
    if (status == KITE_OK) {
        t->eos_id = eos;
        t->bos_id = bos;
        t->add_bos = add_bos;
    }
    return status;
}

kite_status tokenizer_load(const char *dir, tokenizer **out) {
    if (!dir || !out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "tokenizer_load: NULL argument");
    *out = NULL;
    char *path = path_join(dir, "tokenizer.json");
    if (!path) return KITE_ERROR_OUT_OF_MEMORY;
    tokenizer *t = NULL;
    /* tokenizer.json is 11 MB: map it (read in up front) instead of copying it into fresh heap pages. The
     * size is checked before the mapping, so an oversized (or sparse) file is refused without being read. */
    file_mapping mapping;
    kite_status status = file_map(path, true, TOKENIZER_JSON_MAX_BYTES, KITE_ERROR_INVALID_TOKENIZER, &mapping);
    if (status == KITE_OK) {
        status = tokenizer_load_json(mapping.data ? mapping.data : "", mapping.size, path, &t);
        file_unmap(&mapping);
    }
    free(path);
    path = NULL;
    if (status == KITE_OK) {
        path = path_join(dir, "tokenizer_config.json");
        if (!path) status = KITE_ERROR_OUT_OF_MEMORY;
    }
    if (status == KITE_OK && path_exists(path)) { /* optional: eos / bos / add_bos_token */
        char *text = NULL;
        size_t length = 0;
        status = file_read_all(path, TOKENIZER_CONFIG_MAX_BYTES, KITE_ERROR_INVALID_TOKENIZER, &text, &length);
        if (status == KITE_OK) status = tokenizer_apply_config_json(t, text, length, path);
        free(text);
    }
    free(path);
    if (status != KITE_OK) {
        tokenizer_free(t);
        return status;
    }
    *out = t;
    return KITE_OK;
}

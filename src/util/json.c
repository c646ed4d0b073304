/* A strict JSON reader: recursive descent over the input, values collected on a scratch stack and moved
 * into one arena when their container closes, so each array or object ends up as one contiguous run.
 * Everything lives in the arena; json_free() releases it in one go. */
#include "util/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- arena -------------------------------------------------------------------------------------- */

typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t capacity;
    size_t used;
    max_align_t data[]; /* aligned storage follows */
} arena_chunk;

struct json_document {
    arena_chunk *chunks;
    size_t next_chunk_size;
    json_value root;
};

/* Memory for big, short-lived buffers. tokenizer.json makes tens of megabytes of values; touching that
 * many fresh 4 KiB pages costs more than the parse itself on some virtual machines, so large blocks come
 * from mmap with transparent huge pages requested. */
enum { BIG_BLOCK_THRESHOLD = 1 << 20, HUGE_PAGE = 2 << 20 };

static void *block_map(size_t size) {
    if (size < BIG_BLOCK_THRESHOLD) return malloc(size);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, size, MADV_HUGEPAGE); /* a hint; failure only costs speed */
#endif
    return p;
}

static void block_unmap(void *p, size_t size) {
    if (!p) return;
    if (size < BIG_BLOCK_THRESHOLD)
        free(p);
    else
        (void)munmap(p, size);
}

static size_t round_up(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

static void *arena_alloc(json_document *doc, size_t size) {
    size = (size + 7u) & ~(size_t)7u; /* every stored type needs at most 8-byte alignment */
    arena_chunk *chunk = doc->chunks;
    if (!chunk || chunk->capacity - chunk->used < size) {
        size_t want = doc->next_chunk_size;
        if (want < size + sizeof(arena_chunk)) want = size + sizeof(arena_chunk);
        /* Only blocks that come from mmap are rounded to huge pages: a small document (a config.json, one
         * streamed chunk) stays one malloc, not a fresh 2 MiB mapping faulted in for a few hundred bytes. */
        if (want >= BIG_BLOCK_THRESHOLD) want = round_up(want, HUGE_PAGE);
        chunk = block_map(want);
        if (!chunk) return NULL;
        chunk->capacity = want - sizeof(arena_chunk);
        chunk->used = 0;
        chunk->next = doc->chunks;
        doc->chunks = chunk;
        doc->next_chunk_size = want * 2;
    }
    void *p = (char *)chunk->data + chunk->used;
    chunk->used += size;
    return p;
}

void json_free(json_document *document) {
    if (!document) return;
    arena_chunk *chunk = document->chunks;
    while (chunk) {
        arena_chunk *next = chunk->next;
        block_unmap(chunk, chunk->capacity + sizeof(arena_chunk));
        chunk = next;
    }
    free(document);
}

const json_value *json_root(const json_document *document) { return &document->root; }

/* ---- parser state ------------------------------------------------------------------------------- */

typedef struct parser {
    const char *text;
    size_t length;
    size_t pos;
    json_document *doc;
    json_error *error;
    bool failed;
    /* Scratch stacks: children of the containers being parsed, innermost last. */
    json_value *value_stack;
    size_t value_count, value_capacity;
    json_member *member_stack;
    size_t member_count, member_capacity;
    /* Scratch hash table for finding repeated keys in large objects (tokenizer.json's vocab). */
    uint64_t *key_slots;
    size_t key_slot_capacity;
    json_duplicate_keys duplicate_keys;
    /* Scratch for decoding one string before it is copied into the arena. */
    char *string_buffer;
    size_t string_capacity;
} parser;

static bool parse_fail(parser *p, const char *message) {
    if (p->failed) return false;
    p->failed = true;
    if (p->error) {
        size_t at = p->pos < p->length ? p->pos : p->length;
        int line = 1, column = 1;
        for (size_t i = 0; i < at; i++) {
            if (p->text[i] == '\n') {
                line++;
                column = 1;
            } else {
                column++;
            }
        }
        p->error->offset = at;
        p->error->line = line;
        p->error->column = column;
        snprintf(p->error->message, sizeof p->error->message, "%s", message);
    }
    return false;
}

static void skip_whitespace(parser *p) {
    while (p->pos < p->length) {
        char c = p->text[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

/* Grows a scratch stack to hold `needed` elements, doubling. */
static bool grow(void **buffer, size_t *capacity, size_t needed, size_t element_size) {
    if (needed <= *capacity) return true;
    size_t new_capacity = *capacity ? *capacity : 64;
    while (new_capacity < needed) {
        if (new_capacity > ((size_t)-1) / 4 / element_size) return false;
        new_capacity *= 2;
    }
    void *grown = block_map(new_capacity * element_size);
    if (!grown) return false;
    if (*capacity) memcpy(grown, *buffer, *capacity * element_size);
    block_unmap(*buffer, *capacity * element_size);
    *buffer = grown;
    *capacity = new_capacity;
    return true;
}

static bool parse_value(parser *p, json_value *out, int depth);

/* ---- strings ------------------------------------------------------------------------------------ */

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool read_hex4(parser *p, uint32_t *out) {
    if (p->length - p->pos < 4) return parse_fail(p, "truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int d = hex_digit(p->text[p->pos + (size_t)i]);
        if (d < 0) return parse_fail(p, "bad hex digit in \\u escape");
        v = (v << 4) | (uint32_t)d;
    }
    p->pos += 4;
    *out = v;
    return true;
}

static size_t utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid UTF-8 sequence starting at s (at most `available` bytes), 0 if invalid. */
static size_t utf8_sequence_length(const unsigned char *s, size_t available) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t n;
    uint32_t min;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        min = 0x10000;
    } else {
        return 0;
    }
    if (available < n) return 0;
    uint32_t cp = c & (0x7F >> n);
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return n;
}

size_t json_utf8_sequence_length(const char *s, size_t available) {
    return available ? utf8_sequence_length((const unsigned char *)s, available) : 0;
}

/* Parses a string at p->pos (which is at the opening quote); the decoded bytes go to the arena. */
static bool parse_string(parser *p, const char **out, size_t *out_length) {
    p->pos++; /* opening quote */
    /* Fast path: most strings (tokenizer vocab, merges) have no escapes, so validate them in place
     * and copy once into the arena. */
    size_t scan = p->pos;
    const unsigned char *bytes = (const unsigned char *)p->text;
    while (scan < p->length) {
        unsigned char c = bytes[scan];
        if (c == '"' || c == '\\' || c < 0x20) break;
        if (c < 0x80) {
            scan++;
        } else {
            size_t n = utf8_sequence_length(bytes + scan, p->length - scan);
            if (n == 0) break; /* the slow path reports it */
            scan += n;
        }
    }
    if (scan < p->length && bytes[scan] == '"') {
        size_t length = scan - p->pos;
        char *copy = arena_alloc(p->doc, length + 1);
        if (!copy) return parse_fail(p, "out of memory");
        memcpy(copy, p->text + p->pos, length);
        copy[length] = '\0';
        p->pos = scan + 1;
        *out = copy;
        *out_length = length;
        return true;
    }
    size_t used = 0;
    for (;;) {
        /* Copy a run of plain bytes at once: the common case for tokenizer.json. */
        size_t run_start = p->pos;
        while (p->pos < p->length) {
            unsigned char c = (unsigned char)p->text[p->pos];
            if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
            p->pos++;
        }
        size_t run = p->pos - run_start;
        if (run) {
            if (!grow((void **)&p->string_buffer, &p->string_capacity, used + run + 4, 1))
                return parse_fail(p, "out of memory");
            memcpy(p->string_buffer + used, p->text + run_start, run);
            used += run;
        }
        if (p->pos >= p->length) return parse_fail(p, "unterminated string");
        unsigned char c = (unsigned char)p->text[p->pos];
        if (!grow((void **)&p->string_buffer, &p->string_capacity, used + 8, 1))
            return parse_fail(p, "out of memory");
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20) return parse_fail(p, "control character in string");
        if (c >= 0x80) {
            size_t n = utf8_sequence_length((const unsigned char *)p->text + p->pos, p->length - p->pos);
            if (n == 0) return parse_fail(p, "invalid UTF-8 in string");
            memcpy(p->string_buffer + used, p->text + p->pos, n);
            used += n;
            p->pos += n;
            continue;
        }
        /* backslash escape */
        p->pos++;
        if (p->pos >= p->length) return parse_fail(p, "unterminated escape");
        char e = p->text[p->pos++];
        switch (e) {
        case '"': p->string_buffer[used++] = '"'; break;
        case '\\': p->string_buffer[used++] = '\\'; break;
        case '/': p->string_buffer[used++] = '/'; break;
        case 'b': p->string_buffer[used++] = '\b'; break;
        case 'f': p->string_buffer[used++] = '\f'; break;
        case 'n': p->string_buffer[used++] = '\n'; break;
        case 'r': p->string_buffer[used++] = '\r'; break;
        case 't': p->string_buffer[used++] = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (!read_hex4(p, &cp)) return false;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t low;
                if (p->length - p->pos < 2 || p->text[p->pos] != '\\' || p->text[p->pos + 1] != 'u')
                    return parse_fail(p, "unpaired high surrogate in \\u escape");
                p->pos += 2;
                if (!read_hex4(p, &low)) return false;
                if (low < 0xDC00 || low > 0xDFFF) return parse_fail(p, "bad low surrogate in \\u escape");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return parse_fail(p, "unpaired low surrogate in \\u escape");
            }
            used += utf8_encode(cp, p->string_buffer + used);
            break;
        }
        default: p->pos--; return parse_fail(p, "unknown escape in string");
        }
    }
    char *copy = arena_alloc(p->doc, used + 1);
    if (!copy) return parse_fail(p, "out of memory");
    if (used) memcpy(copy, p->string_buffer, used);
    copy[used] = '\0';
    *out = copy;
    *out_length = used;
    return true;
}

/* ---- numbers ------------------------------------------------------------------------------------ */

static bool parse_number(parser *p, json_value *out) {
    size_t start = p->pos;
    const char *t = p->text;
    size_t n = p->length;
    bool negative = false, integral = true;
    if (p->pos < n && t[p->pos] == '-') {
        negative = true;
        p->pos++;
    }
    if (p->pos >= n || t[p->pos] < '0' || t[p->pos] > '9') return parse_fail(p, "bad number");
    if (t[p->pos] == '0') {
        p->pos++;
    } else {
        while (p->pos < n && t[p->pos] >= '0' && t[p->pos] <= '9') p->pos++;
    }
    if (p->pos < n && t[p->pos] == '.') {
        integral = false;
        p->pos++;
        if (p->pos >= n || t[p->pos] < '0' || t[p->pos] > '9') return parse_fail(p, "bad number fraction");
        while (p->pos < n && t[p->pos] >= '0' && t[p->pos] <= '9') p->pos++;
    }
    if (p->pos < n && (t[p->pos] == 'e' || t[p->pos] == 'E')) {
        integral = false;
        p->pos++;
        if (p->pos < n && (t[p->pos] == '+' || t[p->pos] == '-')) p->pos++;
        if (p->pos >= n || t[p->pos] < '0' || t[p->pos] > '9') return parse_fail(p, "bad number exponent");
        while (p->pos < n && t[p->pos] >= '0' && t[p->pos] <= '9') p->pos++;
    }
    size_t literal_length = p->pos - start;
    if (integral && literal_length <= 18) {
        /* Small integers (all of tokenizer.json's ids) need no strtod: the digits are exact in int64
         * and in double alike. */
        int64_t magnitude = 0;
        for (size_t i = start + (negative ? 1 : 0); i < p->pos; i++) magnitude = magnitude * 10 + (t[i] - '0');
        int64_t value = negative ? -magnitude : magnitude;
        out->type = JSON_TYPE_NUMBER;
        out->is_integer = true;
        out->is_big_integer = false;
        out->as.num.integer = value;
        out->as.num.number = (double)value;
        if (negative && magnitude == 0) out->as.num.number = -0.0;
        return true;
    }
    char buffer[64];
    if (literal_length >= sizeof buffer) {
        /* Long literals are legal; go through a heap copy so strtod sees a terminated string. */
        char *heap = malloc(literal_length + 1);
        if (!heap) return parse_fail(p, "out of memory");
        memcpy(heap, t + start, literal_length);
        heap[literal_length] = '\0';
        out->as.num.number = strtod(heap, NULL);
        free(heap);
    } else {
        memcpy(buffer, t + start, literal_length);
        buffer[literal_length] = '\0';
        out->as.num.number = strtod(buffer, NULL);
    }
    out->type = JSON_TYPE_NUMBER;
    out->is_integer = false;
    out->is_big_integer = false;
    out->as.num.integer = 0;
    if (integral) {
        /* Exact int64 from the digits, refusing overflow rather than rounding through double. */
        uint64_t magnitude = 0;
        bool overflow = false;
        for (size_t i = start + (negative ? 1 : 0); i < p->pos; i++) {
            uint64_t digit = (uint64_t)(t[i] - '0');
            if (magnitude > (UINT64_MAX - digit) / 10) {
                overflow = true;
                break;
            }
            magnitude = magnitude * 10 + digit;
        }
        uint64_t limit = negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        if (!overflow && magnitude <= limit) {
            out->is_integer = true;
            out->as.num.integer = negative ? (int64_t)(0 - magnitude) : (int64_t)magnitude;
        } else {
            char *digits = arena_alloc(p->doc, literal_length + 1);
            if (!digits) return parse_fail(p, "out of memory");
            memcpy(digits, t + start, literal_length);
            digits[literal_length] = '\0';
            out->is_big_integer = true;
            out->as.num.digits = digits;
        }
    }
    return true;
}

/* ---- repeated keys ------------------------------------------------------------------------------ */

/* Objects up to this many members are checked pairwise; larger ones through a hash table, so an object of
 * n members costs O(n), not O(n^2) (tokenizer.json's vocab has ~151k). */
enum { DUPLICATE_SCAN_MAX = 8 };

/* Eight bytes at a time (keys are short: the hash is a visible share of reading tokenizer.json), then
 * splitmix64's finalizer, so both the low bits (the slot) and the high ones (the tag) are well mixed. */
static uint64_t key_hash(const char *key, size_t length) {
    uint64_t h = 0x9e3779b97f4a7c15u ^ (uint64_t)length;
    size_t i = 0;
    for (; i + 8 <= length; i += 8) {
        uint64_t word;
        memcpy(&word, key + i, 8);
        h = (h ^ word) * 0xbf58476d1ce4e5b9u;
        h ^= h >> 31;
    }
    if (i < length) {
        uint64_t word = 0; /* the last 1..7 bytes, little end first; a byte loop beats a memcpy call here */
        for (unsigned shift = 0; i < length; i++, shift += 8) word |= (uint64_t)(unsigned char)key[i] << shift;
        h = (h ^ word) * 0xbf58476d1ce4e5b9u;
        h ^= h >> 31;
    }
    h ^= h >> 29;
    h *= 0x94d049bb133111ebu;
    return h ^ (h >> 32);
}

static bool keys_equal(const json_member *a, const json_member *b) {
    return a->key_length == b->key_length && memcmp(a->key, b->key, a->key_length) == 0;
}

/* Where member `index` of the object at text[object_start] has its key: the object is read again, so only a
 * parse that fails pays for positions. Its members parsed once already, so reading them again succeeds. */
static size_t locate_key(parser *p, size_t object_start, size_t index, int depth) {
    p->pos = object_start + 1; /* { */
    for (size_t i = 0;; i++) {
        skip_whitespace(p);
        const size_t key_start = p->pos;
        const char *key;
        size_t key_length;
        json_value value;
        if (i == index || !parse_string(p, &key, &key_length)) return key_start;
        skip_whitespace(p);
        p->pos++; /* : */
        if (!parse_value(p, &value, depth + 1)) return key_start;
        skip_whitespace(p);
        p->pos++; /* , */
    }
}

/* Fails at the repeated key with `duplicate key "K"`; K is escaped and cut at 64 bytes with "..." said. */
static bool fail_duplicate_key(parser *p, const json_member *member, size_t object_start, size_t index, int depth) {
    char shown[64 * 4 + 4];
    size_t n = 0;
    for (size_t i = 0; i < member->key_length && i < 64; i++) {
        const unsigned char c = (unsigned char)member->key[i];
        if (c < 0x20 || c == 0x7f || c == '"' || c == '\\')
            n += (size_t)snprintf(shown + n, sizeof shown - n, "\\x%02x", c);
        else
            shown[n++] = (char)c;
    }
    shown[n] = '\0';
    char message[sizeof shown + 32];
    snprintf(message, sizeof message, "duplicate key \"%s\"%s", shown, member->key_length > 64 ? "..." : "");
    const size_t key_offset = locate_key(p, object_start, index, depth);
    if (p->failed) return false;
    p->pos = key_offset;
    return parse_fail(p, message);
}

/* Adds members[i] (hash h) to the key table, or resolves it against the earlier member with its key. */
static bool place_key(parser *p, json_member *members, size_t i, uint64_t h, size_t slots, size_t *kept,
                      size_t object_start, int depth) {
    const uint64_t tag = h & 0xffffffff00000000u;
    size_t s = (size_t)h & (slots - 1);
    for (;;) {
        const uint64_t slot = p->key_slots[s];
        if (slot == 0) {
            if (*kept != i) members[*kept] = members[i];
            p->key_slots[s] = tag | (uint64_t)(*kept + 1);
            (*kept)++;
            return true;
        }
        const size_t j = (size_t)(slot & 0xffffffffu) - 1;
        if ((slot & 0xffffffff00000000u) == tag && keys_equal(&members[j], &members[i])) {
            if (p->duplicate_keys == JSON_DUPLICATE_KEYS_REFUSE)
                return fail_duplicate_key(p, &members[i], object_start, i, depth);
            members[j].value = members[i].value;
            return true;
        }
        s = (s + 1) & (slots - 1);
    }
}

/* Checks the `*count` members of the object that starts at member_stack[base] (text[object_start]). A
 * repeated key fails the parse, or under JSON_DUPLICATE_KEYS_LAST_WINS its value replaces the earlier one
 * in place and the repeat is dropped, as in a Python dict, so *count may shrink. */
static bool resolve_duplicate_keys(parser *p, size_t base, size_t *count, size_t object_start, int depth) {
    if (*count == 0) return true; /* an empty object: member_stack may not exist yet (NULL + 0 is undefined) */
    json_member *members = p->member_stack + base;
    const size_t n = *count;
    size_t kept = 0;
    if (n <= DUPLICATE_SCAN_MAX) {
        for (size_t i = 0; i < n; i++) {
            size_t j = 0;
            while (j < kept && !keys_equal(&members[j], &members[i])) j++;
            if (j == kept) {
                members[kept++] = members[i];
            } else if (p->duplicate_keys == JSON_DUPLICATE_KEYS_REFUSE) {
                return fail_duplicate_key(p, &members[i], object_start, i, depth);
            } else {
                members[j].value = members[i].value;
            }
        }
        *count = kept;
        return true;
    }
    if (n >= UINT32_MAX) return parse_fail(p, "object has too many members");
    size_t slots = 16;
    while (slots < n + n / 2) slots *= 2; /* at most two thirds full, so probes stay short */
    if (!grow((void **)&p->key_slots, &p->key_slot_capacity, slots, sizeof(uint64_t)))
        return parse_fail(p, "out of memory");
    memset(p->key_slots, 0, slots * sizeof(uint64_t));
    /* A slot holds the hash's top 32 bits and 1 + the kept member's index; 0 is empty. The table outgrows
     * the caches for large objects, so hashes are computed PREFETCH_AHEAD keys early and their slots fetched
     * while earlier keys are placed. */
    enum { PREFETCH_AHEAD = 16 };
    uint64_t ahead[PREFETCH_AHEAD]; /* the hashes of members i - PREFETCH_AHEAD .. i - 1, by index modulo */
    for (size_t i = 0; i < n + PREFETCH_AHEAD; i++) {
        if (i >= PREFETCH_AHEAD) {
            const size_t k = i - PREFETCH_AHEAD;
            if (!place_key(p, members, k, ahead[k % PREFETCH_AHEAD], slots, &kept, object_start, depth)) return false;
        }
        if (i < n) {
            ahead[i % PREFETCH_AHEAD] = key_hash(members[i].key, members[i].key_length);
            __builtin_prefetch(&p->key_slots[(size_t)ahead[i % PREFETCH_AHEAD] & (slots - 1)]);
        }
    }
    *count = kept;
    return true;
}

/* ---- containers --------------------------------------------------------------------------------- */

static bool parse_array(parser *p, json_value *out, int depth) {
    p->pos++; /* [ */
    size_t base = p->value_count;
    skip_whitespace(p);
    if (p->pos < p->length && p->text[p->pos] == ']') {
        p->pos++;
    } else {
        for (;;) {
            json_value item;
            if (!parse_value(p, &item, depth + 1)) return false;
            if (!grow((void **)&p->value_stack, &p->value_capacity, p->value_count + 1, sizeof(json_value)))
                return parse_fail(p, "out of memory");
            p->value_stack[p->value_count++] = item;
            skip_whitespace(p);
            if (p->pos >= p->length) return parse_fail(p, "unterminated array");
            char c = p->text[p->pos++];
            if (c == ']') break;
            if (c != ',') {
                p->pos--;
                return parse_fail(p, "expected ',' or ']' in array");
            }
        }
    }
    size_t count = p->value_count - base;
    json_value *items = NULL;
    if (count) {
        items = arena_alloc(p->doc, count * sizeof(json_value));
        if (!items) return parse_fail(p, "out of memory");
        memcpy(items, p->value_stack + base, count * sizeof(json_value));
    }
    p->value_count = base;
    out->type = JSON_TYPE_ARRAY;
    out->is_integer = false;
    out->is_big_integer = false;
    out->length = count;
    out->as.items = items;
    return true;
}

static bool parse_object(parser *p, json_value *out, int depth) {
    const size_t object_start = p->pos;
    p->pos++; /* { */
    size_t base = p->member_count;
    skip_whitespace(p);
    if (p->pos < p->length && p->text[p->pos] == '}') {
        p->pos++;
    } else {
        for (;;) {
            skip_whitespace(p);
            if (p->pos >= p->length || p->text[p->pos] != '"') return parse_fail(p, "expected a string key");
            json_member member;
            if (!parse_string(p, &member.key, &member.key_length)) return false;
            skip_whitespace(p);
            if (p->pos >= p->length || p->text[p->pos] != ':') return parse_fail(p, "expected ':' after key");
            p->pos++;
            if (!parse_value(p, &member.value, depth + 1)) return false;
            if (!grow((void **)&p->member_stack, &p->member_capacity, p->member_count + 1, sizeof(json_member)))
                return parse_fail(p, "out of memory");
            p->member_stack[p->member_count++] = member;
            skip_whitespace(p);
            if (p->pos >= p->length) return parse_fail(p, "unterminated object");
            char c = p->text[p->pos++];
            if (c == '}') break;
            if (c != ',') {
                p->pos--;
                return parse_fail(p, "expected ',' or '}' in object");
            }
        }
    }
    size_t count = p->member_count - base;
    if (!resolve_duplicate_keys(p, base, &count, object_start, depth)) return false;
    json_member *members = NULL;
    if (count) {
        members = arena_alloc(p->doc, count * sizeof(json_member));
        if (!members) return parse_fail(p, "out of memory");
        memcpy(members, p->member_stack + base, count * sizeof(json_member));
    }
    p->member_count = base;
    out->type = JSON_TYPE_OBJECT;
    out->is_integer = false;
    out->is_big_integer = false;
    out->length = count;
    out->as.members = members;
    return true;
}

static bool match_literal(parser *p, const char *literal) {
    size_t n = strlen(literal);
    if (p->length - p->pos < n || memcmp(p->text + p->pos, literal, n) != 0) return parse_fail(p, "unexpected token");
    p->pos += n;
    return true;
}

static bool parse_value(parser *p, json_value *out, int depth) {
    if (depth > JSON_MAX_DEPTH) return parse_fail(p, "nesting deeper than 256 levels");
    skip_whitespace(p);
    if (p->pos >= p->length) return parse_fail(p, "unexpected end of input");
    memset(out, 0, sizeof *out);
    char c = p->text[p->pos];
    switch (c) {
    case '{': return parse_object(p, out, depth);
    case '[': return parse_array(p, out, depth);
    case '"':
        out->type = JSON_TYPE_STRING;
        return parse_string(p, &out->as.string, &out->length);
    case 't': out->type = JSON_TYPE_TRUE; return match_literal(p, "true");
    case 'f': out->type = JSON_TYPE_FALSE; return match_literal(p, "false");
    case 'n': out->type = JSON_TYPE_NULL; return match_literal(p, "null");
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p, out);
        return parse_fail(p, "unexpected character");
    }
}

json_document *json_parse(const char *text, size_t length, json_error *error) {
    const json_parse_options options = {.duplicate_keys = JSON_DUPLICATE_KEYS_REFUSE};
    return json_parse_with_options(text, length, &options, error);
}

json_document *json_parse_with_options(const char *text, size_t length, const json_parse_options *options,
                                       json_error *error) {
    if (error) memset(error, 0, sizeof *error);
    json_document *doc = calloc(1, sizeof *doc);
    if (!doc) {
        if (error) snprintf(error->message, sizeof error->message, "out of memory");
        return NULL;
    }
    /* Values take a few times the bytes of their text: size the first arena block from the input. */
    doc->next_chunk_size = length * 2;
    parser p = {.text = text,
                .length = length,
                .doc = doc,
                .error = error,
                .duplicate_keys = options ? options->duplicate_keys : JSON_DUPLICATE_KEYS_REFUSE};
    bool ok = text != NULL && parse_value(&p, &doc->root, 0);
    if (!text) parse_fail(&p, "no input");
    if (ok) {
        skip_whitespace(&p);
        if (p.pos != p.length) ok = parse_fail(&p, "trailing characters after the JSON value");
    }
    block_unmap(p.value_stack, p.value_capacity * sizeof(json_value));
    block_unmap(p.member_stack, p.member_capacity * sizeof(json_member));
    block_unmap(p.key_slots, p.key_slot_capacity * sizeof(uint64_t));
    block_unmap(p.string_buffer, p.string_capacity);
    if (!ok) {
        json_free(doc);
        return NULL;
    }
    return doc;
}

/* ---- lookups ------------------------------------------------------------------------------------ */

const json_value *json_object_member(const json_value *object, const char *key) {
    if (!object || object->type != JSON_TYPE_OBJECT) return NULL;
    size_t key_length = strlen(key);
    for (size_t i = 0; i < object->length; i++) {
        const json_member *m = &object->as.members[i];
        if (m->key_length == key_length && memcmp(m->key, key, key_length) == 0) return &m->value;
    }
    return NULL;
}

bool json_get_int64(const json_value *value, int64_t *out) {
    if (!value || value->type != JSON_TYPE_NUMBER || !value->is_integer) return false;
    *out = value->as.num.integer;
    return true;
}

bool json_get_double(const json_value *value, double *out) {
    if (!value || value->type != JSON_TYPE_NUMBER || !isfinite(value->as.num.number)) return false;
    *out = value->as.num.number;
    return true;
}

bool json_get_bool(const json_value *value, bool *out) {
    if (!value || (value->type != JSON_TYPE_TRUE && value->type != JSON_TYPE_FALSE)) return false;
    *out = value->type == JSON_TYPE_TRUE;
    return true;
}

const char *json_type_name(json_type type) {
    switch (type) {
    case JSON_TYPE_NULL: return "null";
    case JSON_TYPE_FALSE:
    case JSON_TYPE_TRUE: return "boolean";
    case JSON_TYPE_NUMBER: return "number";
    case JSON_TYPE_STRING: return "string";
    case JSON_TYPE_ARRAY: return "array";
    case JSON_TYPE_OBJECT: return "object";
    }
    return "unknown";
}

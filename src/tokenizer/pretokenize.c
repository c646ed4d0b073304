/* Text before BPE: UTF-8 repair, NFC normalization (utf8proc) and the split regex (PCRE2). */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tokenizer_internal.h"
#include "tokenizer/unicode_overrides.h"
#include "util/error.h"

/* ---- UTF-8 ---------------------------------------------------------------------------------------- */

size_t utf8_sequence_check(const unsigned char *s, size_t available, size_t *maximal_subpart) {
    unsigned char c = s[0];
    *maximal_subpart = 1;
    if (c < 0x80) return 1;
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF; /* the allowed range of the second byte (Unicode table 3-7) */
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F; /* nothing past U+10FFFF */
    } else {
        return 0;
    }
    size_t i = 1;
    for (; i < need && i < available; i++) {
        unsigned char b = s[i];
        unsigned char low = i == 1 ? lo : 0x80, high = i == 1 ? hi : 0xBF;
        if (b < low || b > high) break;
    }
    if (i == need) return need;
    /* A valid prefix of a sequence that is cut short or broken: one U+FFFD covers all of it, as in
     * Python's errors="replace" and Rust's from_utf8_lossy ("maximal subpart" practice). */
    *maximal_subpart = i;
    return 0;
}

static const char replacement_character[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

kite_status utf8_repair(const char *text, size_t length, char **out, size_t *out_length) {
    const unsigned char *s = (const unsigned char *)text;
    *out = NULL;
    *out_length = 0;
    size_t i = 0;
    /* Fast scan: most text is valid, and then no copy is made. */
    while (i < length) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t subpart;
        size_t n = utf8_sequence_check(s + i, length - i, &subpart);
        if (n == 0) break;
        i += n;
    }
    if (i == length) return KITE_OK;

    /* Worst case: every byte becomes a 3-byte U+FFFD. */
    if (length > (SIZE_MAX - 1) / 3) return kite_fail(KITE_ERROR_INVALID_INPUT, "tokenizer: text too long");
    char *copy = malloc(length * 3 + 1);
    if (!copy) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory repairing UTF-8");
    memcpy(copy, text, i);
    size_t o = i;
    while (i < length) {
        size_t subpart;
        size_t n = s[i] < 0x80 ? 1 : utf8_sequence_check(s + i, length - i, &subpart);
        if (n > 0) {
            memcpy(copy + o, s + i, n);
            o += n;
            i += n;
        } else {
            memcpy(copy + o, replacement_character, 3);
            o += 3;
            i += subpart;
        }
    }
    copy[o] = '\0';
    *out = copy;
    *out_length = o;
    return KITE_OK;
}

kite_status utf8_append_lossy(char **buffer, size_t *length, size_t *capacity, const char *text, size_t n) {
    size_t need = *length + n * 3 + 1;
    if (need > *capacity) {
        size_t cap = *capacity ? *capacity : 64;
        while (cap < need) cap *= 2;
        char *grown = realloc(*buffer, cap);
        if (!grown) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory decoding");
        *buffer = grown;
        *capacity = cap;
    }
    const unsigned char *s = (const unsigned char *)text;
    char *o = *buffer + *length;
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            *o++ = (char)s[i++];
            continue;
        }
        size_t subpart;
        size_t k = utf8_sequence_check(s + i, n - i, &subpart);
        if (k > 0) {
            memcpy(o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(o, replacement_character, 3);
            o += 3;
            i += subpart;
        }
    }
    *o = '\0';
    *length = (size_t)(o - *buffer);
    return KITE_OK;
}

/* ---- NFC ------------------------------------------------------------------------------------------ */

/* True when the code point cannot change under NFC whatever surrounds it: no canonical decomposition,
 * combining class 0, and it never combines with a preceding character. Such text needs no utf8proc pass. */
static bool code_point_nfc_inert(utf8proc_int32_t cp) {
    if (cp < 0x300) return true; /* Latin-1 and below: nothing combines with what precedes */
    if (cp >= 0x1100 && cp <= 0x11FF) return false; /* Hangul jamo compose algorithmically */
    if (cp >= 0xAC00 && cp <= 0xD7A3) return false; /* Hangul syllables take trailing jamo */
    const utf8proc_property_t *p = utf8proc_get_property(cp);
    if (p->combining_class != 0) return false;
    if (p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0) return false; /* canonical decomposition */
    if (p->comp_exclusion) return false;
    /* comb_index marks characters that take part in a canonical composition; those with the top bit
     * set can be the second of a pair and so change what precedes them. */
    if (p->comb_index != UINT16_MAX && (p->comb_index & 0x8000)) return false;
    return true;
}

static bool text_is_nfc_inert(const char *text, size_t length) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < length) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        utf8proc_int32_t cp;
        utf8proc_ssize_t n = utf8proc_iterate(s + i, (utf8proc_ssize_t)(length - i), &cp);
        if (n <= 0) return false;
        if (!code_point_nfc_inert(cp)) return false;
        i += (size_t)n;
    }
    return true;
}

kite_status pretokenize_normalize(const tokenizer *t, const char *text, size_t length, char **out,
                                  size_t *out_length) {
    *out = NULL;
    *out_length = 0;
    if (!t->normalize_nfc || text_is_nfc_inert(text, length)) return KITE_OK;
    utf8proc_uint8_t *result = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)length, &result,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (n < 0) {
        free(result);
        if (n == UTF8PROC_ERROR_NOMEM) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory in NFC");
        return kite_fail(KITE_ERROR_INVALID_INPUT, "tokenizer: NFC normalization failed: %s", utf8proc_errmsg(n));
    }
    *out = (char *)result;
    *out_length = (size_t)n;
    return KITE_OK;
}

/* ---- split regex ---------------------------------------------------------------------------------- */

kite_status pretokenize_compile(tokenizer *t, const char *pattern, size_t length, const char *where) {
    if (t->n_splits == TOKENIZER_MAX_SPLITS)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: more than %d Split pre-tokenizers", where, TOKENIZER_MAX_SPLITS);
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)pattern, length, PCRE2_UTF | PCRE2_UCP, &error_code,
                                     &error_offset, NULL);
    if (!code) {
        PCRE2_UCHAR message[160];
        if (pcre2_get_error_message(error_code, message, sizeof message) < 0)
            strcpy((char *)message, "unknown error");
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: regex not accepted by PCRE2 at offset %zu: %s", where,
                         (size_t)error_offset, (const char *)message);
    }
    /* JIT makes matching several times faster; without it (some hardened systems forbid executable
     * memory) the interpreter gives the same results. */
    bool jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    if (t->n_splits == 0)
        t->jit = jit;
    else
        t->jit = t->jit && jit;
    t->splits[t->n_splits++] = code;
    return KITE_OK;
}

typedef struct split_state {
    pcre2_match_data *match_data;
    pcre2_match_context *context; /* only created when a bigger JIT stack is needed */
    pcre2_jit_stack *jit_stack;
    size_t jit_stack_size;
} split_state;

static void split_state_release(split_state *s) {
    if (s->match_data) pcre2_match_data_free(s->match_data);
    if (s->context) pcre2_match_context_free(s->context);
    if (s->jit_stack) pcre2_jit_stack_free(s->jit_stack);
}

static int split_match(const tokenizer *t, pcre2_code *code, split_state *s, const char *text, size_t length,
                       size_t start) {
    /* Very long runs of one class can outgrow the default 32 KiB JIT stack: retry with bigger ones. */
    static const size_t stack_sizes[] = {1u << 20, 16u << 20, 256u << 20};
    for (;;) {
        int rc;
        if (t->jit)
            rc = pcre2_jit_match(code, (PCRE2_SPTR)text, length, start, 0, s->match_data, s->context);
        else
            rc = pcre2_match(code, (PCRE2_SPTR)text, length, start, PCRE2_NO_UTF_CHECK, s->match_data, s->context);
        if (rc != PCRE2_ERROR_JIT_STACKLIMIT || !t->jit) return rc;
        size_t next = 0;
        for (size_t i = 0; i < sizeof stack_sizes / sizeof stack_sizes[0]; i++) {
            if (stack_sizes[i] > s->jit_stack_size) {
                next = stack_sizes[i];
                break;
            }
        }
        if (next == 0) return rc;
        if (!s->context) {
            s->context = pcre2_match_context_create(NULL);
            if (!s->context) return PCRE2_ERROR_NOMEMORY;
        }
        if (s->jit_stack) pcre2_jit_stack_free(s->jit_stack);
        s->jit_stack = pcre2_jit_stack_create(32u << 10, next, NULL);
        s->jit_stack_size = next;
        if (!s->jit_stack) return PCRE2_ERROR_NOMEMORY;
        pcre2_jit_stack_assign(s->context, NULL, s->jit_stack);
    }
}

static kite_status split_recursive(const tokenizer *t, size_t level, split_state *states, const char *text,
                                   size_t length, pretokenize_piece_fn piece, void *user);

static kite_status split_emit(const tokenizer *t, size_t level, split_state *states, const char *text,
                              size_t length, pretokenize_piece_fn piece, void *user) {
    if (length == 0) return KITE_OK; /* Hugging Face drops empty splits */
    if (level + 1 < t->n_splits) return split_recursive(t, level + 1, states, text, length, piece, user);
    return piece(user, text, length);
}

static kite_status split_recursive(const tokenizer *t, size_t level, split_state *states, const char *text,
                                   size_t length, pretokenize_piece_fn piece, void *user) {
    pcre2_code *code = t->splits[level];
    split_state *s = &states[level];
    size_t previous = 0, start = 0;
    while (start < length) {
        int rc = split_match(t, code, s, text, length, start);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR message[160];
            if (pcre2_get_error_message(rc, message, sizeof message) < 0) strcpy((char *)message, "unknown error");
            return kite_fail(KITE_ERROR_INVALID_INPUT, "tokenizer: split regex failed: %s", (const char *)message);
        }
        PCRE2_SIZE *ovector = pcre2_get_ovector_pointer(s->match_data);
        size_t match_start = ovector[0], match_end = ovector[1];
        if (match_end <= match_start) {
            /* An empty match splits nothing; step one character on, as Rust regex iterators do. */
            size_t step = 1;
            while (start + step < length && ((unsigned char)text[start + step] & 0xC0) == 0x80) step++;
            start = match_start + step;
            continue;
        }
        /* Isolated: the text between matches and each match are separate pieces. */
        KITE_TRY(split_emit(t, level, states, text + previous, match_start - previous, piece, user));
        KITE_TRY(split_emit(t, level, states, text + match_start, match_end - match_start, piece, user));
        previous = start = match_end;
    }
    return split_emit(t, level, states, text + previous, length - previous, piece, user);
}

/* ---- Unicode version differences ------------------------------------------------------------------ */

static uint32_t override_stand_in(uint32_t cp) {
    size_t lo = 0, hi = sizeof unicode_overrides / sizeof unicode_overrides[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < unicode_overrides[mid].first)
            hi = mid;
        else if (cp > unicode_overrides[mid].last)
            lo = mid + 1;
        else
            return unicode_overrides[mid].stand_in;
    }
    return 0;
}

static void utf8_write(uint32_t c, size_t n, char *out) {
    if (n == 2) {
        out[0] = (char)(0xC0 | (c >> 6));
        out[1] = (char)(0x80 | (c & 0x3F));
    } else if (n == 3) {
        out[0] = (char)(0xE0 | (c >> 12));
        out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F));
    } else {
        out[0] = (char)(0xF0 | (c >> 18));
        out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[3] = (char)(0x80 | (c & 0x3F));
    }
}

/* PCRE2's Unicode tables are older than Hugging Face's (unicode_overrides.h lists where they disagree for
 * the split regex). The regex runs over a copy in which each such character is replaced by a stand-in of
 * the same UTF-8 length that PCRE2 classifies as Hugging Face does; offsets are unchanged, so the pieces
 * are cut from the original text. NULL *out when the text has none. */
static kite_status apply_overrides(const char *text, size_t length, char **out) {
    const unsigned char *s = (const unsigned char *)text;
    *out = NULL;
    for (size_t i = 0; i < length; i++) {
        if (s[i] < 0xE1) continue; /* every listed code point takes 3 or 4 bytes, led by 0xE1 or above */
        utf8proc_int32_t cp;
        utf8proc_ssize_t n = utf8proc_iterate(s + i, (utf8proc_ssize_t)(length - i), &cp);
        if (n <= 0) continue;
        uint32_t stand_in = override_stand_in((uint32_t)cp);
        if (stand_in) {
            if (!*out) {
                *out = malloc(length + 1);
                if (!*out) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory splitting text");
                memcpy(*out, text, length);
            }
            utf8_write(stand_in, (size_t)n, *out + i);
        }
        i += (size_t)n - 1;
    }
    return KITE_OK;
}

typedef struct override_relay {
    const char *original;
    const char *copy;
    pretokenize_piece_fn piece;
    void *user;
} override_relay;

static kite_status relay_piece(void *user, const char *piece, size_t length) {
    override_relay *r = user;
    return r->piece(r->user, r->original + (piece - r->copy), length);
}

kite_status pretokenize_split(const tokenizer *t, const char *text, size_t length, pretokenize_piece_fn piece,
                              void *user) {
    if (t->n_splits == 0) return length ? piece(user, text, length) : KITE_OK;
    char *copy = NULL;
    KITE_TRY(apply_overrides(text, length, &copy));
    override_relay relay = {text, copy, piece, user};
    if (copy) {
        text = copy;
        piece = relay_piece;
        user = &relay;
    }
    split_state states[TOKENIZER_MAX_SPLITS];
    memset(states, 0, sizeof states);
    kite_status status = KITE_OK;
    for (size_t i = 0; i < t->n_splits; i++) {
        states[i].match_data = pcre2_match_data_create_from_pattern(t->splits[i], NULL);
        if (!states[i].match_data) {
            status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory for regex match data");
            break;
        }
    }
    if (status == KITE_OK) status = split_recursive(t, 0, states, text, length, piece, user);
    for (size_t i = 0; i < t->n_splits; i++) split_state_release(&states[i]);
    free(copy);
    return status;
}

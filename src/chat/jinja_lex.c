/* The template's tokens, as jinja2's lexer makes them with trim_blocks, lstrip_blocks and keep_trailing_newline
 * off (transformers' settings):
 * - newlines are normalized (\r\n and \r become \n) and one trailing newline of the source is dropped;
 * - `{%- ` / `{{- ` / `{#- ` strip all whitespace before the tag, ` -%}` / ` -}}` / ` -#}` all whitespace after;
 * - lstrip_blocks: spaces and tabs between a line's start and a `{%` or `{#` are dropped (not before `{{`, not
 *   with `{%+`); trim_blocks: the first newline after a `%}` or `#}` is dropped (not after `+%}`);
 * - `{% raw %}...{% endraw %}` is text, comments vanish;
 * - inside a tag: names, strings (Python escapes), integers (with _ and 0x/0o/0b), floats, operators; a tag ends
 *   only where its brackets balance, as in jinja2.
 * Line statements and custom delimiters are not supported (transformers does not configure them).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja_internal.h"
#include "util/error.h"

typedef struct lexer {
    jinja_arena *arena;
    const char *src; /* normalized source */
    size_t length;
    const char *name;
    size_t pos;
    size_t line_pos; /* the position `line` was counted up to */
    int line;
    bool line_starting; /* the previous tag's end consumed a newline */
    jinja_token *tokens;
    size_t count, capacity;
    char balance[JINJA_MAX_NESTING];
    int depth;
} lexer;

static _Noreturn void lex_fail(lexer *lx, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static _Noreturn void lex_fail(lexer *lx, int line, const char *fmt, ...) {
    char message[256];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    lx->arena->status = kite_fail(KITE_ERROR_INVALID_TEMPLATE, "%s:%d: %s", lx->name, line, message);
    longjmp(*lx->arena->on_fail, 1);
}

static int line_at(lexer *lx, size_t pos) {
    for (; lx->line_pos < pos; lx->line_pos++)
        if (lx->src[lx->line_pos] == '\n') lx->line++;
    return lx->line;
}

static jinja_token *push(lexer *lx, jinja_token_kind kind, size_t at) {
    if (lx->count == lx->capacity) {
        size_t capacity = lx->capacity ? lx->capacity * 2 : 256;
        jinja_token *grown = jinja_arena_alloc(lx->arena, capacity * sizeof *grown);
        if (lx->count) memcpy(grown, lx->tokens, lx->count * sizeof *grown);
        lx->tokens = grown;
        lx->capacity = capacity;
    }
    jinja_token *t = &lx->tokens[lx->count++];
    *t = (jinja_token){.kind = kind, .line = line_at(lx, at)};
    return t;
}

static void push_text(lexer *lx, size_t start, size_t end) {
    if (end <= start) return;
    jinja_token *t = push(lx, JINJA_TOKEN_TEXT, start);
    t->text = jinja_arena_strndup(lx->arena, lx->src + start, end - start);
    t->length = end - start;
}

/* Python whitespace (what re's \s and str.rstrip() see) starting at `at`: its byte length, 0 if none. */
static size_t space_at(const lexer *lx, size_t at) {
    if (at >= lx->length) return 0;
    size_t next = at;
    uint32_t c = jinja_utf8_next(lx->src, lx->length, &next);
    return jinja_is_python_space(c) ? next - at : 0;
}

static size_t skip_spaces(const lexer *lx, size_t at) {
    for (size_t n; (n = space_at(lx, at)) > 0;) at += n;
    return at;
}

/* The start of the whitespace that ends src[start..end) (Python's rstrip()). */
static size_t rstrip_from(const lexer *lx, size_t start, size_t end) {
    size_t keep = start;
    for (size_t at = start; at < end;) {
        size_t n = space_at(lx, at);
        if (n) {
            at += n;
        } else {
            jinja_utf8_next(lx->src, end, &at);
            keep = at;
        }
    }
    return keep;
}

/* The text before a tag, with `-` or lstrip_blocks applied: its new end. */
static size_t text_end_before_tag(const lexer *lx, size_t start, size_t end, char sign, bool lstrip_applies) {
    if (sign == '-') return rstrip_from(lx, start, end);
    if (sign == '+' || !lstrip_applies) return end;
    size_t line_start = start;
    bool newline = false;
    for (size_t i = end; i > start; i--)
        if (lx->src[i - 1] == '\n') {
            line_start = i;
            newline = true;
            break;
        }
    /* Without a newline in the text, lstrip reaches back to its start only when the previous tag ended a line. */
    if (!newline && !lx->line_starting) return end;
    if (line_start == end) return end; /* jinja2's \s+ needs at least one character */
    return skip_spaces(lx, line_start) == end ? line_start : end;
}

/* After a `%}` / `#}` / `}}` whose sign (the byte before it) was `sign`: the position after what its end
 * consumes (whitespace for '-', the trim_blocks newline for a block or comment). */
static size_t after_tag_end(lexer *lx, size_t at, char sign, bool trims) {
    if (sign == '-') at = skip_spaces(lx, at);
    else if (sign != '+' && trims && at < lx->length && lx->src[at] == '\n') at++;
    lx->line_starting = at > 0 && lx->src[at - 1] == '\n';
    return at;
}

static bool match_word(const lexer *lx, size_t at, const char *word, size_t *end) {
    size_t n = strlen(word);
    if (at + n > lx->length || memcmp(lx->src + at, word, n) != 0) return false;
    char next = at + n < lx->length ? lx->src[at + n] : '\0';
    if ((next >= 'a' && next <= 'z') || (next >= 'A' && next <= 'Z') || (next >= '0' && next <= '9') || next == '_')
        return false;
    *end = at + n;
    return true;
}

/* `{%(-|+|)\s*WORD\s*` then `-%}` or `%}` (or `+%}` when plus_end) at `at`: the sign before the end and the
 * position after `%}`. */
static bool match_raw_tag(const lexer *lx, size_t at, const char *word, bool plus_end, char *open_sign,
                          char *close_sign, size_t *after) {
    if (at + 2 > lx->length || memcmp(lx->src + at, "{%", 2) != 0) return false;
    size_t p = at + 2;
    *open_sign = '\0';
    if (p < lx->length && (lx->src[p] == '-' || lx->src[p] == '+')) *open_sign = lx->src[p++];
    p = skip_spaces(lx, p);
    if (!match_word(lx, p, word, &p)) return false;
    p = skip_spaces(lx, p);
    *close_sign = '\0';
    if (p < lx->length && (lx->src[p] == '-' || (plus_end && lx->src[p] == '+'))) *close_sign = lx->src[p++];
    if (p + 2 > lx->length || memcmp(lx->src + p, "%}", 2) != 0) return false;
    *after = p + 2;
    return true;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

/* `(\d+_)*\d+` at `at`: its end, or `at` when none. */
static size_t digits_with_underscores(const lexer *lx, size_t at) {
    size_t p = at;
    while (p < lx->length && is_digit(lx->src[p])) {
        while (p < lx->length && is_digit(lx->src[p])) p++;
        if (p + 1 < lx->length && lx->src[p] == '_' && is_digit(lx->src[p + 1])) p++;
    }
    return p;
}

static char *without_underscores(lexer *lx, size_t start, size_t end) {
    char *text = jinja_arena_alloc(lx->arena, end - start + 1);
    size_t n = 0;
    for (size_t i = start; i < end; i++)
        if (lx->src[i] != '_') text[n++] = lx->src[i];
    text[n] = '\0';
    return text;
}

/* A number token at `at` (a digit is there): float_re first, then integer_re, as jinja2 tries them. */
static size_t lex_number(lexer *lx, size_t at) {
    const bool after_dot = at > 0 && lx->src[at - 1] == '.';
    if (!after_dot) {
        size_t p = digits_with_underscores(lx, at);
        size_t q = p;
        bool fraction = false;
        if (q + 1 < lx->length && lx->src[q] == '.' && is_digit(lx->src[q + 1])) {
            q = digits_with_underscores(lx, q + 1);
            fraction = true;
        }
        size_t e = q;
        bool exponent = false;
        if (e < lx->length && (lx->src[e] == 'e' || lx->src[e] == 'E')) {
            size_t f = e + 1;
            if (f < lx->length && (lx->src[f] == '+' || lx->src[f] == '-')) f++;
            if (f < lx->length && is_digit(lx->src[f])) {
                e = digits_with_underscores(lx, f);
                exponent = true;
            }
        }
        if (exponent || fraction) {
            size_t end = exponent ? e : q;
            jinja_token *t = push(lx, JINJA_TOKEN_FLOAT, at);
            t->number = strtod(without_underscores(lx, at, end), NULL);
            return end;
        }
    }
    /* integer_re: 0b/0o/0x with digits, [1-9](_?\d)*, 0(_?0)* */
    const char *s = lx->src;
    size_t p = at;
    int base = 10;
    if (s[p] == '0' && p + 1 < lx->length && strchr("bBoOxX", s[p + 1]) && s[p + 1] != '\0') {
        char kind = (char)(s[p + 1] | 0x20);
        base = kind == 'b' ? 2 : kind == 'o' ? 8 : 16;
        size_t q = p + 2;
        size_t digits_end = q;
        for (;;) {
            size_t r = digits_end;
            if (r < lx->length && s[r] == '_') r++;
            if (r >= lx->length) break;
            char c = (char)(s[r] | 0x20);
            bool ok = base == 2 ? (c == '0' || c == '1') : base == 8 ? (c >= '0' && c <= '7')
                                                                    : (is_digit(c) || (c >= 'a' && c <= 'f'));
            if (!ok) break;
            digits_end = r + 1;
        }
        if (digits_end > q) {
            p = digits_end;
            const char *digits = without_underscores(lx, q, p);
            char *end = NULL;
            unsigned long long v = strtoull(digits, &end, base);
            if (v > (unsigned long long)INT64_MAX || strlen(digits) > 64) lex_fail(lx, line_at(lx, at), "%s", "integer literal too large");
            jinja_token *t = push(lx, JINJA_TOKEN_INT, at);
            t->integer = (int64_t)v;
            return p;
        }
        base = 10;
    }
    if (s[p] == '0') {
        p++;
        while (p < lx->length && (s[p] == '0' || (s[p] == '_' && p + 1 < lx->length && s[p + 1] == '0')))
            p += s[p] == '_' ? 2 : 1;
    } else {
        p = digits_with_underscores(lx, p);
    }
    const char *digits = without_underscores(lx, at, p);
    if (strlen(digits) > 19 || strtoull(digits, NULL, 10) > (unsigned long long)INT64_MAX)
        lex_fail(lx, line_at(lx, at), "%s", "integer literal too large (kite's integers are 64-bit)");
    jinja_token *t = push(lx, JINJA_TOKEN_INT, at);
    t->integer = (int64_t)strtoull(digits, NULL, 10);
    return p;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    c = (char)(c | 0x20);
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* A string literal at `at` (a quote is there), decoded as Python's unicode-escape does. */
static size_t lex_string(lexer *lx, size_t at) {
    const char quote = lx->src[at];
    size_t p = at + 1;
    while (p < lx->length && lx->src[p] != quote) p += lx->src[p] == '\\' && p + 1 < lx->length ? 2 : 1;
    if (p >= lx->length) lex_fail(lx, line_at(lx, at), "%s", "unexpected char '\\'' (an unterminated string)");
    const size_t end = p; /* the closing quote */
    char *out = jinja_arena_alloc(lx->arena, end - at + 1);
    size_t n = 0;
    for (size_t i = at + 1; i < end;) {
        char c = lx->src[i];
        if (c != '\\') {
            out[n++] = c;
            i++;
            continue;
        }
        char e = lx->src[i + 1];
        i += 2;
        switch (e) {
        case '\n': break;
        case '\\': out[n++] = '\\'; break;
        case '\'': out[n++] = '\''; break;
        case '"': out[n++] = '"'; break;
        case 'a': out[n++] = '\a'; break;
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'n': out[n++] = '\n'; break;
        case 'r': out[n++] = '\r'; break;
        case 't': out[n++] = '\t'; break;
        case 'v': out[n++] = '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
            int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t code_point = 0;
            for (int k = 0; k < digits; k++) {
                int h = i < end ? hex_value(lx->src[i]) : -1;
                if (h < 0) lex_fail(lx, line_at(lx, at), "truncated \\%cXX escape in a string", e);
                code_point = code_point * 16 + (uint32_t)h;
                i++;
            }
            if (code_point > 0x10FFFF) lex_fail(lx, line_at(lx, at), "%s", "illegal Unicode character in a string");
            n += jinja_utf8_put(out + n, code_point);
            break;
        }
        case 'N': lex_fail(lx, line_at(lx, at), "%s", "\\N{...} escapes are not supported");
        default:
            if (e >= '0' && e <= '7') {
                uint32_t code_point = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i < end && lx->src[i] >= '0' && lx->src[i] <= '7'; k++, i++)
                    code_point = code_point * 8 + (uint32_t)(lx->src[i] - '0');
                n += jinja_utf8_put(out + n, code_point);
            } else {
                /* Python keeps an unknown escape as it is. */
                out[n++] = '\\';
                i--;
            }
        }
    }
    out[n] = '\0';
    jinja_token *t = push(lx, JINJA_TOKEN_STRING, at);
    t->text = out;
    t->length = n;
    return end + 1;
}

static const char *const operators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                        "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};

/* The tokens of one `{{ }}` or `{% %}` from `at` (after its opening sign) through its end; returns the
 * position after it. */
static size_t lex_tag(lexer *lx, size_t at, bool block, size_t tag_start) {
    const char *close = block ? "%}" : "}}";
    lx->depth = 0;
    size_t p = at;
    for (;;) {
        if (p >= lx->length)
            lex_fail(lx, line_at(lx, tag_start), "unexpected end of template, expected '%s'",
                     block ? "end of statement block" : "end of print statement");
        const char *s = lx->src + p;
        if (lx->depth == 0) {
            char sign = '\0';
            size_t q = p;
            if ((s[0] == '-' || (block && s[0] == '+')) && p + 1 < lx->length) {
                sign = s[0];
                q++;
            }
            if (q + 2 <= lx->length && memcmp(lx->src + q, close, 2) == 0) {
                push(lx, block ? JINJA_TOKEN_BLOCK_END : JINJA_TOKEN_VAR_END, p);
                return after_tag_end(lx, q + 2, sign, block);
            }
        }
        size_t space = space_at(lx, p);
        if (space) {
            p += space;
            continue;
        }
        if (is_digit(s[0])) {
            p = lex_number(lx, p);
            continue;
        }
        if (is_name_start(s[0])) {
            size_t q = p;
            while (q < lx->length && is_name_char(lx->src[q])) q++;
            jinja_token *t = push(lx, JINJA_TOKEN_NAME, p);
            t->text = jinja_arena_strndup(lx->arena, s, q - p);
            t->length = q - p;
            p = q;
            continue;
        }
        if (s[0] == '\'' || s[0] == '"') {
            p = lex_string(lx, p);
            continue;
        }
        const char *op = NULL;
        for (size_t i = 0; i < sizeof operators / sizeof operators[0]; i++) {
            size_t n = strlen(operators[i]);
            if (p + n <= lx->length && memcmp(s, operators[i], n) == 0) {
                op = operators[i];
                break;
            }
        }
        if (!op) {
            char shown[8];
            snprintf(shown, sizeof shown, "%c", s[0]);
            lex_fail(lx, line_at(lx, p), "unexpected char '%s'", shown);
        }
        char c = op[0];
        if (op[1] == '\0' && (c == '(' || c == '[' || c == '{')) {
            if (lx->depth >= JINJA_MAX_NESTING) lex_fail(lx, line_at(lx, p), "%s", "brackets nested too deeply");
            lx->balance[lx->depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
        } else if (op[1] == '\0' && (c == ')' || c == ']' || c == '}')) {
            if (lx->depth == 0) lex_fail(lx, line_at(lx, p), "unexpected '%s'", op);
            if (lx->balance[lx->depth - 1] != c) {
                char message[64];
                snprintf(message, sizeof message, "unexpected '%c', expected '%c'", c, lx->balance[lx->depth - 1]);
                lex_fail(lx, line_at(lx, p), "%s", message);
            }
            lx->depth--;
        }
        jinja_token *t = push(lx, JINJA_TOKEN_OPERATOR, p);
        t->text = op;
        t->length = strlen(op);
        p += t->length;
    }
}

/* The position of the two bytes `pair` at or after `from`, or NULL (the source may hold NUL bytes). */
static const char *find_pair(const lexer *lx, size_t from, const char *pair) {
    for (size_t i = from; i + 1 < lx->length; i++)
        if (lx->src[i] == pair[0] && lx->src[i + 1] == pair[1]) return lx->src + i;
    return NULL;
}

/* Newlines normalized to \n and one trailing newline dropped, as jinja2's tokeniter does first. */
static char *normalize(jinja_arena *arena, const char *source, size_t length, size_t *out_length) {
    char *text = jinja_arena_alloc(arena, length + 1);
    size_t n = 0;
    for (size_t i = 0; i < length; i++) {
        if (source[i] == '\r') {
            text[n++] = '\n';
            if (i + 1 < length && source[i + 1] == '\n') i++;
        } else {
            text[n++] = source[i];
        }
    }
    if (n > 0 && text[n - 1] == '\n') n--;
    text[n] = '\0';
    *out_length = n;
    return text;
}

void jinja_lex(jinja_arena *arena, const char *source, size_t length, const char *name, jinja_token_list *out) {
    lexer lx = {.arena = arena, .name = name, .line = 1, .line_starting = true};
    lx.src = normalize(arena, source, length, &lx.length);
    size_t text_start = 0;
    size_t p = 0;
    while (p < lx.length) {
        const char *hit = memchr(lx.src + p, '{', lx.length - p);
        if (!hit || (size_t)(hit - lx.src) + 1 >= lx.length) break;
        size_t at = (size_t)(hit - lx.src);
        char kind = lx.src[at + 1];
        if (kind != '{' && kind != '%' && kind != '#') {
            p = at + 1;
            continue;
        }
        char sign = at + 2 < lx.length && (lx.src[at + 2] == '-' || lx.src[at + 2] == '+') ? lx.src[at + 2] : '\0';
        size_t text_end = text_end_before_tag(&lx, text_start, at, sign, kind != '{');
        push_text(&lx, text_start, text_end);
        size_t body = at + 2 + (sign ? 1 : 0);
        char open_sign, close_sign;
        size_t after;
        if (kind == '%' && match_raw_tag(&lx, at, "raw", false, &open_sign, &close_sign, &after)) {
            /* `{% raw %}` ends without trim_blocks (jinja2's rule), `-%}` strips what follows. */
            if (close_sign == '-') after = skip_spaces(&lx, after);
            lx.line_starting = after > 0 && lx.src[after - 1] == '\n';
            size_t q = after;
            size_t end_at = 0, end_after = 0;
            char end_open = 0, end_close = 0;
            for (;;) {
                const char *h = find_pair(&lx, q, "{%");
                if (!h) lex_fail(&lx, line_at(&lx, at), "%s", "Missing end of raw directive");
                end_at = (size_t)(h - lx.src);
                if (match_raw_tag(&lx, end_at, "endraw", true, &end_open, &end_close, &end_after)) break;
                q = end_at + 1;
            }
            size_t raw_end = text_end_before_tag(&lx, after, end_at, end_open, true);
            push_text(&lx, after, raw_end);
            p = text_start = after_tag_end(&lx, end_after, end_close, true);
            continue;
        }
        if (kind == '#') {
            /* The first "#}" ends it; a '-' or '+' just before it (inside the comment) is its sign. */
            const char *h = find_pair(&lx, body, "#}");
            if (!h) lex_fail(&lx, line_at(&lx, at), "%s", "Missing end of comment tag");
            size_t close_at = (size_t)(h - lx.src);
            char close = close_at > body && (lx.src[close_at - 1] == '-' || lx.src[close_at - 1] == '+')
                             ? lx.src[close_at - 1]
                             : '\0';
            p = text_start = after_tag_end(&lx, close_at + 2, close, true);
            continue;
        }
        push(&lx, kind == '%' ? JINJA_TOKEN_BLOCK_BEGIN : JINJA_TOKEN_VAR_BEGIN, at);
        p = text_start = lex_tag(&lx, body, kind == '%', at);
    }
    push_text(&lx, text_start, lx.length);
    push(&lx, JINJA_TOKEN_EOF, lx.length);
    out->tokens = lx.tokens;
    out->count = lx.count;
}

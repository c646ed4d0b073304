/* jinja2's filters and tests, Python's str/dict/list methods as the immutable sandbox exposes them, attribute
 * and item access, and the global functions (raise_exception, strftime_now, namespace, range, dict).
 *
 * Filters: abs attr batch capitalize count d default dictsort e escape first float indent int items join last
 * length list lower map max min reject rejectattr replace reverse round safe select selectattr sort string sum
 * title tojson (transformers' json.dumps) trim unique upper. Not supported (refused when parsing): center
 * filesizeformat forceescape format groupby pprint random slice striptags truncate urlencode urlize wordcount
 * wordwrap xmlattr.
 * Tests: all of jinja2's (defined undefined none boolean true false integer float number string mapping iterable
 * sequence callable sameas escaped odd even divisibleby eq/equalto/== ne/!= lt/lessthan/< le/<= gt/greaterthan/>
 * ge/>= in lower upper filter test).
 * Methods: str capitalize count endswith find index isalnum isalpha isdigit islower isspace isupper join lower
 * lstrip removeprefix removesuffix replace rfind rindex rsplit rstrip split splitlines startswith strip title
 * upper; dict get items keys values; list count index; loop.cycle. Python's other str/dict/list methods are
 * refused by name; the mutating ones fail as the sandbox's SecurityError does.
 * Case mapping uses utf8proc's simple mappings plus the common multi-character ones (ß -> SS, ligatures, İ);
 * title() and capitalize() use the simple title-case mapping (Python's 'ß'.title() is 'Ss', here 'ß').
 * safe and escape return Markup strings (escape leaves them alone, `+` escapes the other side, repr shows
 * Markup('...')); the other filters and methods return plain strings where markupsafe would keep Markup.
 * Generators (map, select, ...) are computed when made and consumed as Python consumes them; dict views
 * (d.items()) and range() are lists.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "chat/jinja_internal.h"
#include "util/error.h"

/* ---- names ------------------------------------------------------------------------------------------------ */

typedef enum jinja_filter {
    FILTER_ABS, FILTER_ATTR, FILTER_BATCH, FILTER_CAPITALIZE, FILTER_COUNT, FILTER_D, FILTER_DEFAULT,
    FILTER_DICTSORT, FILTER_E, FILTER_ESCAPE, FILTER_FIRST, FILTER_FLOAT, FILTER_INDENT, FILTER_INT, FILTER_ITEMS,
    FILTER_JOIN, FILTER_LAST, FILTER_LENGTH, FILTER_LIST, FILTER_LOWER, FILTER_MAP, FILTER_MAX, FILTER_MIN,
    FILTER_REJECT, FILTER_REJECTATTR, FILTER_REPLACE, FILTER_REVERSE, FILTER_ROUND, FILTER_SAFE, FILTER_SELECT,
    FILTER_SELECTATTR, FILTER_SORT, FILTER_STRING, FILTER_SUM, FILTER_TITLE, FILTER_TOJSON, FILTER_TRIM,
    FILTER_UNIQUE, FILTER_UPPER, FILTER_COUNT_OF,
} jinja_filter;

static const char *const filter_names[FILTER_COUNT_OF] = {
    "abs", "attr", "batch", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first", "float",
    "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min", "reject",
    "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum", "title",
    "tojson", "trim", "unique", "upper",
};

static const char *const jinja2_other_filters[] = {
    "center", "filesizeformat", "forceescape", "format", "groupby", "pprint", "random", "slice", "striptags",
    "truncate", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr", NULL,
};

typedef enum jinja_test {
    TEST_BOOLEAN, TEST_CALLABLE, TEST_DEFINED, TEST_DIVISIBLEBY, TEST_EQ, TEST_EQUALTO, TEST_ESCAPED, TEST_EVEN,
    TEST_FALSE, TEST_FILTER, TEST_FLOAT, TEST_GE, TEST_GT, TEST_GREATERTHAN, TEST_IN, TEST_INTEGER, TEST_ITERABLE,
    TEST_LE, TEST_LESSTHAN, TEST_LOWER, TEST_LT, TEST_MAPPING, TEST_NE, TEST_NONE, TEST_NUMBER, TEST_ODD,
    TEST_SAMEAS, TEST_SEQUENCE, TEST_STRING, TEST_TEST, TEST_TRUE, TEST_UNDEFINED, TEST_UPPER, TEST_COUNT_OF,
} jinja_test;

static const char *const test_names[TEST_COUNT_OF] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even", "false", "filter",
    "float", "ge", "gt", "greaterthan", "in", "integer", "iterable", "le", "lessthan", "lower", "lt", "mapping",
    "ne", "none", "number", "odd", "sameas", "sequence", "string", "test", "true", "undefined", "upper",
};

int jinja_filter_lookup(const char *name) {
    for (int i = 0; i < FILTER_COUNT_OF; i++)
        if (!strcmp(filter_names[i], name)) return i;
    return -1;
}

int jinja_test_lookup(const char *name) {
    for (int i = 0; i < TEST_COUNT_OF; i++)
        if (!strcmp(test_names[i], name)) return i;
    return -1;
}

bool jinja_filter_is_jinja2(const char *name) {
    for (size_t i = 0; jinja2_other_filters[i]; i++)
        if (!strcmp(jinja2_other_filters[i], name)) return true;
    return false;
}

bool jinja_test_is_jinja2(const char *name) {
    (void)name;
    return false; /* every jinja2 test is implemented */
}

/* ---- arguments ---------------------------------------------------------------------------------------------- */

typedef struct arguments {
    const jinja_value *args;
    size_t n_args;
    const char **names;
    const jinja_value *kwargs;
    size_t n_kwargs;
} arguments;

#define MAX_PARAMS 8

/* Binds positional and keyword arguments to `params` (NULL-terminated) as Python does; values[i] is undefined
 * (kind UNDEFINED with a NULL message) where not given. */
static void bind(jinja_render_context *ctx, const char *what, const arguments *a, const char *const *params,
                 jinja_value *values, bool *given) {
    size_t n_params = 0;
    while (params[n_params]) n_params++;
    for (size_t i = 0; i < n_params; i++) {
        values[i] = jinja_undefined(NULL);
        given[i] = false;
    }
    if (a->n_args > n_params)
        jinja_runtime_error(ctx, "%s takes at most %zu argument(s) (%zu given)", what, n_params, a->n_args);
    for (size_t i = 0; i < a->n_args; i++) {
        values[i] = a->args[i];
        given[i] = true;
    }
    for (size_t k = 0; k < a->n_kwargs; k++) {
        size_t i = 0;
        while (i < n_params && strcmp(params[i], a->names[k]) != 0) i++;
        if (i == n_params) jinja_runtime_error(ctx, "%s got an unexpected keyword argument '%s'", what, a->names[k]);
        if (given[i]) jinja_runtime_error(ctx, "%s got multiple values for argument '%s'", what, a->names[k]);
        values[i] = a->kwargs[k];
        given[i] = true;
    }
}

static void no_arguments(jinja_render_context *ctx, const char *what, const arguments *a) {
    if (a->n_args || a->n_kwargs) jinja_runtime_error(ctx, "%s takes no arguments", what);
}

static bool is_int(jinja_value v) { return v.kind == JINJA_INT || v.kind == JINJA_BOOL; }
static int64_t int_of(jinja_value v) { return v.kind == JINJA_INT ? v.as.integer : (int64_t)v.as.boolean; }
static bool is_number(jinja_value v) { return is_int(v) || v.kind == JINJA_FLOAT; }
static double float_of(jinja_value v) { return v.kind == JINJA_FLOAT ? v.as.number : (double)int_of(v); }

static int64_t need_int(jinja_render_context *ctx, const char *what, jinja_value v) {
    if (!is_int(v)) {
        jinja_check_defined(ctx, v);
        jinja_runtime_error(ctx, "%s: an integer is required, not '%s'", what, jinja_type_name(v));
    }
    return int_of(v);
}

static jinja_value need_string(jinja_render_context *ctx, const char *what, jinja_value v) {
    if (v.kind != JINJA_STRING) {
        jinja_check_defined(ctx, v);
        jinja_runtime_error(ctx, "%s: a string is required, not '%s'", what, jinja_type_name(v));
    }
    return v;
}

/* ---- strings ------------------------------------------------------------------------------------------------ */

typedef struct string_builder {
    char *data;
    size_t length, capacity;
} string_builder;

/* Arena-backed appends (no cleanup needed when an error unwinds). */
static void sb_append(jinja_render_context *ctx, string_builder *b, const char *data, size_t n) {
    if (b->length + n + 1 > b->capacity) {
        size_t capacity = b->capacity ? b->capacity : 64;
        while (capacity < b->length + n + 1) {
            if (capacity > JINJA_MAX_ARENA_BYTES) jinja_runtime_error(ctx, "a string past the memory limit");
            capacity *= 2;
        }
        char *grown = jinja_arena_alloc(&ctx->arena, capacity);
        if (b->length) memcpy(grown, b->data, b->length);
        b->data = grown;
        b->capacity = capacity;
    }
    if (n) memcpy(b->data + b->length, data, n);
    b->length += n;
    b->data[b->length] = '\0';
}

static void sb_put_code_point(jinja_render_context *ctx, string_builder *b, uint32_t c) {
    char utf8[4];
    sb_append(ctx, b, utf8, jinja_utf8_put(utf8, c));
}

static jinja_value sb_value(string_builder *b) { return jinja_string(b->data ? b->data : "", b->length); }

typedef enum case_change { CASE_UPPER, CASE_LOWER } case_change;

/* The unconditional multi-character mappings of Unicode's SpecialCasing.txt that Python applies and a simple
 * mapping lacks: the German sharp s, the Latin ligatures, and capital I with dot above. */
static const char *full_case_mapping(uint32_t c, case_change how) {
    if (how == CASE_LOWER) return c == 0x130 ? "i\xcc\x87" : NULL;
    switch (c) {
    case 0xDF: return "SS";
    case 0xFB00: return "FF";
    case 0xFB01: return "FI";
    case 0xFB02: return "FL";
    case 0xFB03: return "FFI";
    case 0xFB04: return "FFL";
    case 0xFB05:
    case 0xFB06: return "ST";
    case 0x149: return "\xca\xbcN";
    default: return NULL;
    }
}

static jinja_value change_case(jinja_render_context *ctx, jinja_value s, case_change how) {
    string_builder b = {0};
    const char *text = s.as.string.data;
    size_t n = s.as.string.length;
    for (size_t at = 0; at < n;) {
        uint32_t c = jinja_utf8_next(text, n, &at);
        const char *full = full_case_mapping(c, how);
        if (full) {
            sb_append(ctx, &b, full, strlen(full));
            continue;
        }
        c = (uint32_t)(how == CASE_UPPER ? utf8proc_toupper((utf8proc_int32_t)c) : utf8proc_tolower((utf8proc_int32_t)c));
        sb_put_code_point(ctx, &b, c);
    }
    sb_append(ctx, &b, "", 0);
    return sb_value(&b);
}

static bool is_cased(uint32_t c) {
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
    return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

/* str.title(): a cased character after an uncased one is title-cased, the rest lower-cased. */
static jinja_value python_title(jinja_render_context *ctx, jinja_value s) {
    string_builder b = {0};
    bool previous_cased = false;
    const char *text = s.as.string.data;
    size_t n = s.as.string.length;
    for (size_t at = 0; at < n;) {
        uint32_t c = jinja_utf8_next(text, n, &at);
        uint32_t out = (uint32_t)(previous_cased ? utf8proc_tolower((utf8proc_int32_t)c)
                                                 : utf8proc_totitle((utf8proc_int32_t)c));
        previous_cased = is_cased(c);
        sb_put_code_point(ctx, &b, out);
    }
    sb_append(ctx, &b, "", 0);
    return sb_value(&b);
}

/* str.capitalize(): the first character title-cased, the rest lower-cased. */
static jinja_value python_capitalize(jinja_render_context *ctx, jinja_value s) {
    string_builder b = {0};
    const char *text = s.as.string.data;
    size_t n = s.as.string.length;
    bool first = true;
    for (size_t at = 0; at < n;) {
        uint32_t c = jinja_utf8_next(text, n, &at);
        c = (uint32_t)(first ? utf8proc_totitle((utf8proc_int32_t)c) : utf8proc_tolower((utf8proc_int32_t)c));
        first = false;
        sb_put_code_point(ctx, &b, c);
    }
    sb_append(ctx, &b, "", 0);
    return sb_value(&b);
}

/* jinja2's title filter: words start after runs of [-\s({[<]; each word's first character upper-cased, the rest
 * lower-cased. */
static jinja_value filter_title(jinja_render_context *ctx, jinja_value s) {
    string_builder b = {0};
    bool word_start = true;
    const char *text = s.as.string.data;
    size_t n = s.as.string.length;
    for (size_t at = 0; at < n;) {
        uint32_t c = jinja_utf8_next(text, n, &at);
        bool separator = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || jinja_is_python_space(c);
        uint32_t out = c;
        if (!separator)
            out = (uint32_t)(word_start ? utf8proc_toupper((utf8proc_int32_t)c) : utf8proc_tolower((utf8proc_int32_t)c));
        word_start = separator;
        sb_put_code_point(ctx, &b, out);
    }
    sb_append(ctx, &b, "", 0);
    return sb_value(&b);
}

static bool in_chars(uint32_t c, jinja_value chars) {
    if (chars.kind != JINJA_STRING) return jinja_is_python_space(c);
    const char *s = chars.as.string.data;
    size_t n = chars.as.string.length;
    for (size_t at = 0; at < n;)
        if (jinja_utf8_next(s, n, &at) == c) return true;
    return false;
}

/* str.strip / lstrip / rstrip: `chars` a string, or not a string for whitespace. */
static jinja_value python_strip(jinja_value s, jinja_value chars, bool left, bool right) {
    const char *text = s.as.string.data;
    size_t n = s.as.string.length;
    size_t start = 0, end = n;
    if (left)
        while (start < n) {
            size_t at = start;
            if (!in_chars(jinja_utf8_next(text, n, &at), chars)) break;
            start = at;
        }
    if (right) {
        /* Walk forward remembering where the last kept character ends. */
        size_t keep = start;
        for (size_t at = start; at < n;) {
            uint32_t c = jinja_utf8_next(text, n, &at);
            if (!in_chars(c, chars)) keep = at;
        }
        end = keep;
    }
    return jinja_string(text + start, end - start);
}

static jinja_value strip_chars_arg(jinja_render_context *ctx, const char *what, jinja_value chars) {
    if (chars.kind == JINJA_STRING || chars.kind == JINJA_NONE || (chars.kind == JINJA_UNDEFINED && !chars.as.string.data))
        return chars;
    jinja_check_defined(ctx, chars);
    jinja_runtime_error(ctx, "%s arg must be None or str", what);
}

static const char *find_bytes(const char *hay, size_t n, const char *needle, size_t m) {
    if (m == 0) return hay;
    if (m > n) return NULL;
    for (size_t i = 0; i + m <= n; i++)
        if (hay[i] == needle[0] && memcmp(hay + i, needle, m) == 0) return hay + i;
    return NULL;
}

static const char *rfind_bytes(const char *hay, size_t n, const char *needle, size_t m) {
    if (m > n) return NULL;
    for (size_t i = n - m + 1; i-- > 0;)
        if (memcmp(hay + i, needle, m) == 0) return hay + i;
    return NULL;
}

static jinja_value python_replace(jinja_render_context *ctx, jinja_value s, jinja_value old, jinja_value new_,
                                  int64_t count) {
    const char *text = s.as.string.data;
    size_t n = s.as.string.length, m = old.as.string.length;
    string_builder b = {0};
    int64_t done = 0;
    if (m == 0) {
        /* Python inserts `new` before every character and at the end. */
        for (size_t at = 0;;) {
            if (count >= 0 && done >= count) {
                sb_append(ctx, &b, text + at, n - at);
                break;
            }
            sb_append(ctx, &b, new_.as.string.data, new_.as.string.length);
            done++;
            if (at >= n) break;
            size_t next = at;
            jinja_utf8_next(text, n, &next);
            sb_append(ctx, &b, text + at, next - at);
            at = next;
        }
        sb_append(ctx, &b, "", 0);
        return sb_value(&b);
    }
    size_t at = 0;
    while (at <= n) {
        const char *hit = (count < 0 || done < count) ? find_bytes(text + at, n - at, old.as.string.data, m) : NULL;
        if (!hit) break;
        size_t pos = (size_t)(hit - text);
        sb_append(ctx, &b, text + at, pos - at);
        sb_append(ctx, &b, new_.as.string.data, new_.as.string.length);
        at = pos + m;
        done++;
    }
    sb_append(ctx, &b, text + at, n - at);
    jinja_count_steps(ctx, (uint64_t)done);
    return sb_value(&b);
}

/* str.split / rsplit; sep not a string: runs of whitespace. */
static jinja_value python_split(jinja_render_context *ctx, jinja_value s, jinja_value sep, int64_t maxsplit,
                                bool from_right) {
    const char *text = s.as.string.data;
    size_t n = s.as.string.length;
    jinja_value out = jinja_new_list(ctx, JINJA_LIST, 0);
    if (sep.kind == JINJA_STRING) {
        size_t m = sep.as.string.length;
        if (m == 0) jinja_runtime_error(ctx, "empty separator");
        if (!from_right) {
            size_t at = 0;
            int64_t splits = 0;
            for (;;) {
                const char *hit = (maxsplit < 0 || splits < maxsplit) ? find_bytes(text + at, n - at, sep.as.string.data, m) : NULL;
                if (!hit) break;
                size_t pos = (size_t)(hit - text);
                jinja_list_push(ctx, out.as.list, jinja_string(text + at, pos - at));
                at = pos + m;
                splits++;
            }
            jinja_list_push(ctx, out.as.list, jinja_string(text + at, n - at));
        } else {
            size_t end = n;
            int64_t splits = 0;
            jinja_list *reversed = jinja_new_list(ctx, JINJA_LIST, 0).as.list;
            for (;;) {
                const char *hit = (maxsplit < 0 || splits < maxsplit) ? rfind_bytes(text, end, sep.as.string.data, m) : NULL;
                if (!hit) break;
                size_t pos = (size_t)(hit - text);
                jinja_list_push(ctx, reversed, jinja_string(text + pos + m, end - pos - m));
                end = pos;
                splits++;
            }
            jinja_list_push(ctx, out.as.list, jinja_string(text, end));
            for (size_t i = reversed->count; i-- > 0;) jinja_list_push(ctx, out.as.list, reversed->items[i]);
        }
        jinja_count_steps(ctx, out.as.list->count);
        return out;
    }
    /* Whitespace: split into code points first so both directions walk them the same way. */
    size_t count = jinja_utf8_count(text, n);
    size_t *offsets = jinja_arena_alloc(&ctx->arena, (count + 1) * sizeof *offsets);
    bool *space = jinja_arena_alloc(&ctx->arena, count + 1);
    size_t at = 0;
    for (size_t i = 0; i < count; i++) {
        offsets[i] = at;
        space[i] = jinja_is_python_space(jinja_utf8_next(text, n, &at));
    }
    offsets[count] = n;
    if (!from_right) {
        size_t i = 0;
        int64_t splits = 0;
        while (i < count) {
            while (i < count && space[i]) i++;
            if (i == count) break;
            if (maxsplit >= 0 && splits == maxsplit) {
                /* The rest, with its trailing whitespace kept, as Python does. */
                jinja_list_push(ctx, out.as.list, jinja_string(text + offsets[i], n - offsets[i]));
                break;
            }
            size_t j = i;
            while (j < count && !space[j]) j++;
            jinja_list_push(ctx, out.as.list, jinja_string(text + offsets[i], offsets[j] - offsets[i]));
            splits++;
            i = j;
        }
    } else {
        jinja_list *reversed = jinja_new_list(ctx, JINJA_LIST, 0).as.list;
        size_t i = count;
        int64_t splits = 0;
        while (i > 0) {
            while (i > 0 && space[i - 1]) i--;
            if (i == 0) break;
            if (maxsplit >= 0 && splits == maxsplit) {
                jinja_list_push(ctx, reversed, jinja_string(text, offsets[i]));
                break;
            }
            size_t j = i;
            while (j > 0 && !space[j - 1]) j--;
            jinja_list_push(ctx, reversed, jinja_string(text + offsets[j], offsets[i] - offsets[j]));
            splits++;
            i = j;
        }
        for (size_t k = reversed->count; k-- > 0;) jinja_list_push(ctx, out.as.list, reversed->items[k]);
    }
    jinja_count_steps(ctx, out.as.list->count);
    return out;
}

/* Python's line boundaries: \n \r \r\n \v \f \x1c \x1d \x1e \x85 \u2028 \u2029. */
static bool is_line_break(uint32_t c) {
    return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
           c == 0x2028 || c == 0x2029;
}

static jinja_list *python_splitlines(jinja_render_context *ctx, jinja_value s, bool keepends) {
    const char *text = s.as.string.data;
    size_t n = s.as.string.length;
    jinja_list *lines = jinja_new_list(ctx, JINJA_LIST, 0).as.list;
    size_t start = 0;
    for (size_t at = 0; at < n;) {
        size_t line_end = at;
        uint32_t c = jinja_utf8_next(text, n, &at);
        if (!is_line_break(c)) continue;
        if (c == '\r' && at < n && text[at] == '\n') at++;
        jinja_list_push(ctx, lines, jinja_string(text + start, (keepends ? at : line_end) - start));
        start = at;
    }
    if (start < n) jinja_list_push(ctx, lines, jinja_string(text + start, n - start));
    return lines;
}

/* Byte offset of code point index `index` (clamped to the string). */
static size_t byte_offset(jinja_value s, int64_t index) {
    size_t at = 0;
    for (int64_t i = 0; i < index && at < s.as.string.length; i++)
        jinja_utf8_next(s.as.string.data, s.as.string.length, &at);
    return at;
}

/* The [start, end) byte range of s[start:end] with Python's slice rules for optional int arguments. */
static void substring_range(jinja_render_context *ctx, jinja_value s, const jinja_value *values, const bool *given,
                            size_t *from, size_t *to) {
    int64_t length = (int64_t)jinja_utf8_count(s.as.string.data, s.as.string.length);
    int64_t start = 0, end = length;
    if (given[0] && values[0].kind != JINJA_NONE) start = need_int(ctx, "slice index", values[0]);
    if (given[1] && values[1].kind != JINJA_NONE) end = need_int(ctx, "slice index", values[1]);
    if (start < 0) start = start + length < 0 ? 0 : start + length;
    if (end < 0) end = end + length < 0 ? 0 : end + length;
    if (start > length) start = length + 1; /* past the end: nothing matches, not even "" */
    if (end > length) end = length;
    *from = start > length ? s.as.string.length + 1 : byte_offset(s, start);
    *to = byte_offset(s, end);
}

static bool affix_matches(jinja_render_context *ctx, jinja_value s, size_t from, size_t to, jinja_value affix,
                          bool at_start) {
    if (affix.kind != JINJA_STRING) {
        jinja_check_defined(ctx, affix);
        jinja_runtime_error(ctx, "%s first arg must be str or a tuple of str, not %s",
                            at_start ? "startswith" : "endswith", jinja_type_name(affix));
    }
    if (from > s.as.string.length || to < from) return false;
    size_t n = to - from, m = affix.as.string.length;
    if (m > n) return false;
    const char *text = s.as.string.data + (at_start ? from : to - m);
    return memcmp(text, affix.as.string.data, m) == 0;
}

typedef bool (*code_point_predicate)(uint32_t c);

static bool cp_alpha(uint32_t c) {
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
    return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}
static bool cp_digit(uint32_t c) { return utf8proc_category((utf8proc_int32_t)c) == UTF8PROC_CATEGORY_ND; }
static bool cp_alnum(uint32_t c) {
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
    return cp_alpha(c) || cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}
static bool cp_space(uint32_t c) { return jinja_is_python_space(c); }

/* isalpha / isdigit / isspace / isalnum: non-empty and every character passes. */
static bool all_code_points(jinja_value s, code_point_predicate predicate) {
    if (s.as.string.length == 0) return false;
    for (size_t at = 0; at < s.as.string.length;)
        if (!predicate(jinja_utf8_next(s.as.string.data, s.as.string.length, &at))) return false;
    return true;
}

/* isupper / islower: at least one cased character and none of the other case. */
static bool python_is_case(jinja_value s, bool upper) {
    bool cased = false;
    for (size_t at = 0; at < s.as.string.length;) {
        uint32_t c = jinja_utf8_next(s.as.string.data, s.as.string.length, &at);
        utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
        if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT) {
            if (!upper) return false;
            cased = true;
        } else if (cat == UTF8PROC_CATEGORY_LL) {
            if (upper) return false;
            cased = true;
        }
    }
    return cased;
}

jinja_value jinja_html_escape(jinja_render_context *ctx, jinja_value s) {
    string_builder b = {0};
    for (size_t i = 0; i < s.as.string.length; i++) {
        char c = s.as.string.data[i];
        const char *entity = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '\'' ? "&#39;"
                                                  : c == '"' ? "&#34;"
                                                             : NULL;
        if (entity)
            sb_append(ctx, &b, entity, strlen(entity));
        else
            sb_append(ctx, &b, &c, 1);
    }
    sb_append(ctx, &b, "", 0);
    jinja_value escaped = sb_value(&b);
    escaped.markup = true;
    return escaped;
}

/* Python's str.join over str() of the items (jinja2's join filter converts; str.join requires strings). */
static jinja_value join_items(jinja_render_context *ctx, const jinja_list *items, jinja_value separator,
                              bool require_strings) {
    string_builder b = {0};
    for (size_t i = 0; i < items->count; i++) {
        if (i) sb_append(ctx, &b, separator.as.string.data, separator.as.string.length);
        jinja_value item = items->items[i];
        if (require_strings && item.kind != JINJA_STRING)
            jinja_runtime_error(ctx, "sequence item %zu: expected str instance, %s found", i, jinja_type_name(item));
        jinja_value s = jinja_to_str(ctx, item);
        sb_append(ctx, &b, s.as.string.data, s.as.string.length);
    }
    jinja_count_steps(ctx, items->count);
    sb_append(ctx, &b, "", 0);
    return sb_value(&b);
}

/* ---- attributes and items ----------------------------------------------------------------------------------- */

static const char *const str_methods[] = {
    "capitalize", "count", "endswith", "find", "index", "isalnum", "isalpha", "isdigit", "islower", "isspace",
    "isupper", "join", "lower", "lstrip", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rsplit",
    "rstrip", "split", "splitlines", "startswith", "strip", "title", "upper", NULL,
};
static const char *const str_methods_unsupported[] = {
    "casefold", "center", "encode", "expandtabs", "format", "format_map", "isascii", "isdecimal", "isidentifier",
    "isnumeric", "isprintable", "istitle", "ljust", "maketrans", "partition", "rjust", "rpartition", "swapcase",
    "translate", "zfill", NULL,
};
static const char *const dict_methods[] = {"get", "items", "keys", "values", NULL};
static const char *const dict_methods_unsafe[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};
static const char *const dict_methods_unsupported[] = {"copy", "fromkeys", NULL};
static const char *const list_methods[] = {"count", "index", NULL};
static const char *const list_methods_unsafe[] = {"append", "clear", "extend", "insert", "pop", "remove",
                                                  "reverse", "sort", NULL};
static const char *const list_methods_unsupported[] = {"copy", NULL};

static bool name_in(const char *name, const char *const *names) {
    for (size_t i = 0; names[i]; i++)
        if (!strcmp(names[i], name)) return true;
    return false;
}

static jinja_value bound_method(jinja_render_context *ctx, jinja_value self, const char *name) {
    jinja_method *m = jinja_arena_alloc(&ctx->arena, sizeof *m);
    m->self = self;
    m->name = name;
    return (jinja_value){.kind = JINJA_METHOD, .as.method = m};
}

/* An undefined value whose error says "'<type> object' has no attribute '<name>'". */
static jinja_value no_attribute(jinja_render_context *ctx, const char *type, const char *name) {
    size_t n = strlen(type) + strlen(name) + 40;
    char *message = jinja_arena_alloc(&ctx->arena, n);
    snprintf(message, n, "'%s object' has no attribute '%s'", type, name);
    return jinja_undefined(message);
}

/* The sandbox's unsafe_undefined: printing it gives nothing, using it fails with the SecurityError text. */
static jinja_value unsafe_attribute(jinja_render_context *ctx, const char *type, const char *name) {
    size_t n = strlen(type) + strlen(name) + 60;
    char *message = jinja_arena_alloc(&ctx->arena, n);
    snprintf(message, n, "access to attribute '%s' of '%s' object is unsafe.", name, type);
    return jinja_undefined(message);
}

/* Attributes only (Python's getattr through the sandbox); NULL-kind result means "no such attribute". */
static bool python_getattr(jinja_render_context *ctx, jinja_value object, const char *name, jinja_value *out) {
    const char *const *safe = NULL, *const *unsafe = NULL, *const *unsupported = NULL;
    const char *type = jinja_type_name(object);
    switch (object.kind) {
    case JINJA_STRING:
        safe = str_methods;
        unsupported = str_methods_unsupported;
        break;
    case JINJA_DICT:
        safe = dict_methods;
        unsafe = dict_methods_unsafe;
        unsupported = dict_methods_unsupported;
        break;
    case JINJA_LIST:
    case JINJA_TUPLE:
        safe = list_methods;
        if (object.kind == JINJA_LIST) {
            unsafe = list_methods_unsafe;
            unsupported = list_methods_unsupported;
        }
        break;
    case JINJA_NAMESPACE: {
        jinja_value *v = jinja_dict_get_string(object.as.dict, name);
        if (v) *out = *v;
        return v != NULL;
    }
    case JINJA_LOOP: {
        const jinja_loop *loop = object.as.loop;
        int64_t index0 = (int64_t)loop->index0, length = (int64_t)loop->items->count;
        if (!strcmp(name, "index")) *out = jinja_int(index0 + 1);
        else if (!strcmp(name, "index0")) *out = jinja_int(index0);
        else if (!strcmp(name, "revindex")) *out = jinja_int(length - index0);
        else if (!strcmp(name, "revindex0")) *out = jinja_int(length - index0 - 1);
        else if (!strcmp(name, "first")) *out = jinja_bool(index0 == 0);
        else if (!strcmp(name, "last")) *out = jinja_bool(index0 == length - 1);
        else if (!strcmp(name, "length")) *out = jinja_int(length);
        else if (!strcmp(name, "depth")) *out = jinja_int(1);
        else if (!strcmp(name, "depth0")) *out = jinja_int(0);
        else if (!strcmp(name, "previtem"))
            *out = index0 > 0 ? loop->items->items[index0 - 1] : jinja_undefined("there is no previous item");
        else if (!strcmp(name, "nextitem"))
            *out = index0 + 1 < length ? loop->items->items[index0 + 1] : jinja_undefined("there is no next item");
        else if (!strcmp(name, "cycle")) *out = bound_method(ctx, object, "cycle");
        else if (!strcmp(name, "changed"))
            jinja_runtime_error(ctx, "loop.changed is not supported by kite");
        else
            return false;
        return true;
    }
    default: return false;
    }
    if (name_in(name, safe)) {
        *out = bound_method(ctx, object, name);
        return true;
    }
    if (unsafe && name_in(name, unsafe)) {
        *out = unsafe_attribute(ctx, type, name);
        return true;
    }
    if (unsupported && name_in(name, unsupported))
        jinja_runtime_error(ctx, "the %s method '%s' is not supported by kite", type, name);
    return false;
}

jinja_value jinja_get_attribute(jinja_render_context *ctx, jinja_value object, const char *name) {
    jinja_check_defined(ctx, object);
    jinja_value out;
    if (name[0] != '_' && python_getattr(ctx, object, name, &out)) return out;
    if (object.kind == JINJA_DICT) {
        jinja_value *v = jinja_dict_get_string(object.as.dict, name);
        if (v) return *v;
    }
    return no_attribute(ctx, jinja_type_name(object), name);
}

jinja_value jinja_get_item(jinja_render_context *ctx, jinja_value object, jinja_value key) {
    jinja_check_defined(ctx, object);
    switch (object.kind) {
    case JINJA_DICT: {
        jinja_value *v = jinja_dict_get(object.as.dict, key);
        if (v) return *v;
        break;
    }
    case JINJA_LIST:
    case JINJA_TUPLE:
    case JINJA_STRING:
        if (is_int(key)) {
            int64_t i = int_of(key);
            if (object.kind == JINJA_STRING) {
                int64_t length = (int64_t)jinja_utf8_count(object.as.string.data, object.as.string.length);
                if (i < 0) i += length;
                if (i < 0 || i >= length) return jinja_undefined("string index out of range");
                size_t from = byte_offset(object, i), to = from;
                jinja_utf8_next(object.as.string.data, object.as.string.length, &to);
                return jinja_string(object.as.string.data + from, to - from);
            }
            int64_t length = (int64_t)object.as.list->count;
            if (i < 0) i += length;
            if (i < 0 || i >= length) return jinja_undefined("list index out of range");
            return object.as.list->items[i];
        }
        break;
    default: break;
    }
    if (key.kind == JINJA_STRING) {
        jinja_value out;
        const char *name = jinja_arena_strndup(&ctx->arena, key.as.string.data, key.as.string.length);
        if (name[0] != '_' && python_getattr(ctx, object, name, &out)) return out;
        return no_attribute(ctx, jinja_type_name(object), name);
    }
    return jinja_undefined("no such item");
}

/* `a.b.c` or an integer path part, as jinja2's make_attrgetter walks it (items first, as environment.getitem). */
static jinja_value get_path(jinja_render_context *ctx, jinja_value object, jinja_value attribute) {
    if (is_int(attribute)) return jinja_get_item(ctx, object, attribute);
    jinja_value path = need_string(ctx, "attribute", attribute);
    const char *s = path.as.string.data;
    size_t n = path.as.string.length, start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && s[i] != '.') continue;
        const char *part = s + start;
        size_t length = i - start;
        bool digits = length > 0;
        for (size_t k = 0; k < length; k++)
            if (part[k] < '0' || part[k] > '9') digits = false;
        jinja_value key = digits ? jinja_int(strtoll(jinja_arena_strndup(&ctx->arena, part, length), NULL, 10))
                                 : jinja_string(part, length);
        object = jinja_get_item(ctx, object, key);
        start = i + 1;
    }
    return object;
}

/* ---- tests -------------------------------------------------------------------------------------------------- */

static bool python_sameas(jinja_render_context *ctx, jinja_value a, jinja_value b) {
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case JINJA_NONE: return true;
    case JINJA_BOOL: return a.as.boolean == b.as.boolean;
    case JINJA_INT:
        /* CPython caches -5..256; other equal ints are usually distinct objects. */
        if (a.as.integer >= -5 && a.as.integer <= 256) return a.as.integer == b.as.integer;
        jinja_runtime_error(ctx, "'sameas' on integers outside -5..256 depends on CPython's object identity");
    case JINJA_LIST:
    case JINJA_TUPLE: return a.as.list == b.as.list;
    case JINJA_DICT:
    case JINJA_NAMESPACE: return a.as.dict == b.as.dict;
    case JINJA_MACRO: return a.as.macro == b.as.macro;
    case JINJA_ITERATOR: return a.as.iterator == b.as.iterator;
    default:
        jinja_runtime_error(ctx, "'sameas' on a %s depends on CPython's object identity", jinja_type_name(a));
    }
}

static bool python_contains(jinja_render_context *ctx, jinja_value container, jinja_value item) {
    switch (container.kind) {
    case JINJA_UNDEFINED: return false;
    case JINJA_STRING: {
        jinja_value needle = need_string(ctx, "'in <string>' left operand", item);
        return find_bytes(container.as.string.data, container.as.string.length, needle.as.string.data,
                          needle.as.string.length) != NULL;
    }
    case JINJA_DICT: jinja_check_hashable(ctx, item); return jinja_dict_get(container.as.dict, item) != NULL;
    case JINJA_LIST:
    case JINJA_TUPLE: {
        const jinja_list *items = container.as.list;
        for (size_t i = 0; i < items->count; i++)
            if (jinja_equal(ctx, items->items[i], item)) return true;
        return false;
    }
    case JINJA_ITERATOR: {
        jinja_iterator *it = container.as.iterator;
        while (it->position < it->items->count)
            if (jinja_equal(ctx, it->items->items[it->position++], item)) return true;
        return false;
    }
    default: jinja_runtime_error(ctx, "argument of type '%s' is not iterable", jinja_type_name(container));
    }
}

static jinja_value test_argument(jinja_render_context *ctx, const char *name, const jinja_value *args, size_t n_args,
                                 size_t expected) {
    if (n_args != expected)
        jinja_runtime_error(ctx, "test '%s' takes %zu argument(s), %zu given", name, expected, n_args);
    return expected ? args[0] : jinja_none();
}

bool jinja_apply_test(jinja_render_context *ctx, int test, jinja_value v, const jinja_value *args, size_t n_args) {
    const char *name = test_names[test];
    const size_t wants = test == TEST_SAMEAS || test == TEST_EQ || test == TEST_EQUALTO || test == TEST_NE ||
                                 test == TEST_LT || test == TEST_LESSTHAN || test == TEST_LE || test == TEST_GT ||
                                 test == TEST_GREATERTHAN || test == TEST_GE || test == TEST_IN ||
                                 test == TEST_DIVISIBLEBY
                             ? 1
                             : 0;
    jinja_value arg = test_argument(ctx, name, args, n_args, wants);
    switch ((jinja_test)test) {
    case TEST_DEFINED: return v.kind != JINJA_UNDEFINED;
    case TEST_UNDEFINED: return v.kind == JINJA_UNDEFINED;
    case TEST_NONE: return v.kind == JINJA_NONE;
    case TEST_BOOLEAN: return v.kind == JINJA_BOOL;
    case TEST_TRUE: return v.kind == JINJA_BOOL && v.as.boolean;
    case TEST_FALSE: return v.kind == JINJA_BOOL && !v.as.boolean;
    case TEST_INTEGER: return v.kind == JINJA_INT || v.kind == JINJA_BIG_INT;
    case TEST_FLOAT: return v.kind == JINJA_FLOAT;
    case TEST_NUMBER: return is_number(v) || v.kind == JINJA_BIG_INT;
    case TEST_STRING: return v.kind == JINJA_STRING;
    case TEST_MAPPING: return v.kind == JINJA_DICT;
    case TEST_ITERABLE:
        return v.kind == JINJA_UNDEFINED || v.kind == JINJA_STRING || v.kind == JINJA_LIST || v.kind == JINJA_TUPLE ||
               v.kind == JINJA_DICT || v.kind == JINJA_ITERATOR;
    case TEST_SEQUENCE:
        return v.kind == JINJA_UNDEFINED || v.kind == JINJA_STRING || v.kind == JINJA_LIST || v.kind == JINJA_TUPLE ||
               v.kind == JINJA_DICT;
    case TEST_CALLABLE:
        return v.kind == JINJA_UNDEFINED || v.kind == JINJA_MACRO || v.kind == JINJA_METHOD ||
               v.kind == JINJA_FUNCTION || v.kind == JINJA_LOOP;
    case TEST_ESCAPED: return false; /* nothing is Markup: transformers does not autoescape */
    case TEST_SAMEAS: return python_sameas(ctx, v, arg);
    case TEST_EQ:
    case TEST_EQUALTO: return jinja_equal(ctx, v, arg);
    case TEST_NE: return !jinja_equal(ctx, v, arg);
    case TEST_LT:
    case TEST_LESSTHAN: return jinja_compare(ctx, v, arg) < 0;
    case TEST_LE: return jinja_compare(ctx, v, arg) <= 0;
    case TEST_GT:
    case TEST_GREATERTHAN: return jinja_compare(ctx, v, arg) > 0;
    case TEST_GE: return jinja_compare(ctx, v, arg) >= 0;
    case TEST_IN: return python_contains(ctx, arg, v);
    case TEST_ODD:
    case TEST_EVEN:
    case TEST_DIVISIBLEBY: {
        jinja_check_defined(ctx, v);
        if (!is_number(v)) jinja_runtime_error(ctx, "test '%s' needs a number, not '%s'", name, jinja_type_name(v));
        jinja_value divisor = test == TEST_DIVISIBLEBY ? arg : jinja_int(2);
        if (!is_number(divisor)) jinja_runtime_error(ctx, "test '%s' needs a number", name);
        if (float_of(divisor) == 0.0) jinja_runtime_error(ctx, "integer division or modulo by zero");
        double remainder;
        if (is_int(v) && is_int(divisor)) {
            int64_t d = int_of(divisor), r = int_of(v) % d;
            if (r != 0 && ((r < 0) != (d < 0))) r += d;
            remainder = (double)r;
        } else {
            double d = float_of(divisor);
            remainder = fmod(float_of(v), d);
            if (remainder != 0.0 && ((remainder < 0) != (d < 0))) remainder += d;
        }
        if (test == TEST_ODD) return remainder == 1.0;
        return remainder == 0.0;
    }
    case TEST_LOWER:
    case TEST_UPPER: {
        jinja_value s = jinja_to_str(ctx, v);
        return python_is_case(s, test == TEST_UPPER);
    }
    case TEST_FILTER:
    case TEST_TEST: {
        if (v.kind != JINJA_STRING) return false;
        char *s = jinja_arena_strndup(&ctx->arena, v.as.string.data, v.as.string.length);
        return test == TEST_FILTER ? jinja_filter_lookup(s) >= 0 : jinja_test_lookup(s) >= 0;
    }
    case TEST_COUNT_OF: break;
    }
    jinja_runtime_error(ctx, "internal: unknown test");
}

/* A test named at render time (select('equalto', 3)); jinja2 refuses unknown names then too. */
static int runtime_test(jinja_render_context *ctx, jinja_value name) {
    need_string(ctx, "test name", name);
    char *s = jinja_arena_strndup(&ctx->arena, name.as.string.data, name.as.string.length);
    /* The operator spellings jinja2 registers as tests. */
    static const char *const aliases[][2] = {{"==", "eq"}, {"!=", "ne"}, {"<", "lt"}, {"<=", "le"},
                                             {">", "gt"},  {">=", "ge"}};
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcmp(s, aliases[i][0])) s = (char *)aliases[i][1];
    int test = jinja_test_lookup(s);
    if (test < 0) jinja_runtime_error(ctx, "No test named '%s'.", s);
    return test;
}

/* ---- filters ------------------------------------------------------------------------------------------------ */

/* Stable merge sort of values by keys; jinja_compare raises Python's TypeError on mixed types. */
static void sort_values(jinja_render_context *ctx, jinja_value *items, jinja_value *keys, size_t n, bool reverse) {
    if (n < 2) return;
    jinja_value *tmp_items = jinja_arena_alloc(&ctx->arena, n * sizeof *tmp_items);
    jinja_value *tmp_keys = jinja_arena_alloc(&ctx->arena, n * sizeof *tmp_keys);
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int c = jinja_compare(ctx, keys[j], keys[i]);
                /* Python's sorted(reverse=True) keeps equal items in their order too. */
                bool take_right = reverse ? c > 0 : c < 0;
                if (take_right) {
                    tmp_items[k] = items[j];
                    tmp_keys[k++] = keys[j++];
                } else {
                    tmp_items[k] = items[i];
                    tmp_keys[k++] = keys[i++];
                }
            }
            while (i < mid) {
                tmp_items[k] = items[i];
                tmp_keys[k++] = keys[i++];
            }
            while (j < hi) {
                tmp_items[k] = items[j];
                tmp_keys[k++] = keys[j++];
            }
        }
        memcpy(items, tmp_items, n * sizeof *items);
        memcpy(keys, tmp_keys, n * sizeof *keys);
        jinja_count_steps(ctx, n);
    }
}

/* jinja2's ignore_case: strings lower-cased for comparing. */
static jinja_value sort_key(jinja_render_context *ctx, jinja_value v, bool case_sensitive) {
    if (!case_sensitive && v.kind == JINJA_STRING) return change_case(ctx, v, CASE_LOWER);
    return v;
}

static jinja_list *copy_list(jinja_render_context *ctx, const jinja_list *items) {
    jinja_list *out = jinja_new_list(ctx, JINJA_LIST, items->count).as.list;
    for (size_t i = 0; i < items->count; i++) jinja_list_push(ctx, out, items->items[i]);
    return out;
}

static jinja_value filter_sort(jinja_render_context *ctx, jinja_value input, const arguments *a) {
    static const char *const params[] = {"reverse", "case_sensitive", "attribute", NULL};
    jinja_value v[3];
    bool given[3];
    bind(ctx, "sort", a, params, v, given);
    jinja_list *items = copy_list(ctx, jinja_iterate(ctx, input));
    jinja_value *keys = jinja_arena_alloc(&ctx->arena, (items->count + 1) * sizeof *keys);
    bool case_sensitive = given[1] && jinja_truthy(v[1]);
    if (given[2] && v[2].kind == JINJA_STRING && memchr(v[2].as.string.data, ',', v[2].as.string.length))
        jinja_runtime_error(ctx, "sort by several attributes is not supported by kite");
    for (size_t i = 0; i < items->count; i++) {
        jinja_value key = given[2] && v[2].kind != JINJA_NONE ? get_path(ctx, items->items[i], v[2]) : items->items[i];
        keys[i] = sort_key(ctx, key, case_sensitive);
    }
    sort_values(ctx, items->items, keys, items->count, given[0] && jinja_truthy(v[0]));
    return (jinja_value){.kind = JINJA_LIST, .as.list = items};
}

static jinja_value filter_dictsort(jinja_render_context *ctx, jinja_value input, const arguments *a) {
    static const char *const params[] = {"case_sensitive", "by", "reverse", NULL};
    jinja_value v[3];
    bool given[3];
    bind(ctx, "dictsort", a, params, v, given);
    if (input.kind != JINJA_DICT) jinja_runtime_error(ctx, "dictsort needs a mapping, not '%s'", jinja_type_name(input));
    bool by_value = false;
    if (given[1]) {
        jinja_value by = need_string(ctx, "dictsort by", v[1]);
        if (by.as.string.length == 5 && !memcmp(by.as.string.data, "value", 5)) by_value = true;
        else if (!(by.as.string.length == 3 && !memcmp(by.as.string.data, "key", 3)))
            jinja_runtime_error(ctx, "You can only sort by either \"key\" or \"value\"");
    }
    const jinja_dict *d = input.as.dict;
    jinja_list *pairs = jinja_new_list(ctx, JINJA_LIST, d->count).as.list;
    jinja_value *keys = jinja_arena_alloc(&ctx->arena, (d->count + 1) * sizeof *keys);
    for (size_t i = 0; i < d->count; i++) {
        jinja_value pair = jinja_new_list(ctx, JINJA_TUPLE, 2);
        jinja_list_push(ctx, pair.as.list, d->keys[i]);
        jinja_list_push(ctx, pair.as.list, d->values[i]);
        jinja_list_push(ctx, pairs, pair);
        keys[i] = sort_key(ctx, by_value ? d->values[i] : d->keys[i], given[0] && jinja_truthy(v[0]));
    }
    sort_values(ctx, pairs->items, keys, pairs->count, given[2] && jinja_truthy(v[2]));
    return (jinja_value){.kind = JINJA_LIST, .as.list = pairs};
}

/* select / reject / selectattr / rejectattr: args are [attribute,] [test name, test args...]. */
static jinja_value filter_select(jinja_render_context *ctx, jinja_value input, const arguments *a, bool by_attribute,
                                 bool keep) {
    /* jinja2 looks at nothing, not even its arguments, when the input is false (none, [], "", 0). */
    if (!jinja_truthy(input)) return jinja_new_iterator(ctx, jinja_new_list(ctx, JINJA_LIST, 0).as.list);
    if (a->n_kwargs) jinja_runtime_error(ctx, "keyword arguments to select/reject are not supported by kite");
    size_t next = 0;
    jinja_value attribute = jinja_none();
    if (by_attribute) {
        if (a->n_args == 0) jinja_runtime_error(ctx, "Missing parameter for attribute name");
        attribute = a->args[next++];
    }
    int test = -1;
    if (next < a->n_args) test = runtime_test(ctx, a->args[next++]);
    const jinja_list *items = jinja_iterate(ctx, input);
    jinja_list *out = jinja_new_list(ctx, JINJA_LIST, 0).as.list;
    for (size_t i = 0; i < items->count; i++) {
        jinja_value item = items->items[i];
        jinja_value subject = by_attribute ? get_path(ctx, item, attribute) : item;
        bool passes = test < 0 ? jinja_truthy(subject)
                               : jinja_apply_test(ctx, test, subject, a->args + next, a->n_args - next);
        if (passes == keep) jinja_list_push(ctx, out, item);
    }
    jinja_count_steps(ctx, items->count);
    return jinja_new_iterator(ctx, out);
}

static jinja_value filter_map(jinja_render_context *ctx, jinja_value input, const arguments *a) {
    if (!jinja_truthy(input)) return jinja_new_iterator(ctx, jinja_new_list(ctx, JINJA_LIST, 0).as.list);
    const jinja_list *items = jinja_iterate(ctx, input);
    jinja_list *out = jinja_new_list(ctx, JINJA_LIST, items->count).as.list;
    if (a->n_args == 0) {
        /* map(attribute='x', default=...) */
        jinja_value attribute = jinja_undefined(NULL), fallback = jinja_undefined(NULL);
        bool has_attribute = false, has_default = false;
        for (size_t k = 0; k < a->n_kwargs; k++) {
            if (!strcmp(a->names[k], "attribute")) {
                attribute = a->kwargs[k];
                has_attribute = true;
            } else if (!strcmp(a->names[k], "default")) {
                fallback = a->kwargs[k];
                has_default = true;
            } else {
                jinja_runtime_error(ctx, "Unexpected keyword argument '%s'", a->names[k]);
            }
        }
        if (!has_attribute) jinja_runtime_error(ctx, "map requires a filter argument");
        for (size_t i = 0; i < items->count; i++) {
            jinja_value v = get_path(ctx, items->items[i], attribute);
            if (has_default && v.kind == JINJA_UNDEFINED) v = fallback;
            jinja_list_push(ctx, out, v);
        }
    } else {
        jinja_value name = need_string(ctx, "map filter name", a->args[0]);
        char *s = jinja_arena_strndup(&ctx->arena, name.as.string.data, name.as.string.length);
        int filter = jinja_filter_lookup(s);
        if (filter < 0) jinja_runtime_error(ctx, "No filter named '%s'.", s);
        for (size_t i = 0; i < items->count; i++)
            jinja_list_push(ctx, out, jinja_apply_filter(ctx, filter, items->items[i], a->args + 1, a->n_args - 1,
                                                         a->names, a->kwargs, a->n_kwargs));
    }
    jinja_count_steps(ctx, items->count);
    return jinja_new_iterator(ctx, out);
}

static jinja_value filter_unique(jinja_render_context *ctx, jinja_value input, const arguments *a) {
    static const char *const params[] = {"case_sensitive", "attribute", NULL};
    jinja_value v[2];
    bool given[2];
    bind(ctx, "unique", a, params, v, given);
    bool case_sensitive = given[0] && jinja_truthy(v[0]);
    const jinja_list *items = jinja_iterate(ctx, input);
    jinja_list *out = jinja_new_list(ctx, JINJA_LIST, 0).as.list;
    jinja_list *seen = jinja_new_list(ctx, JINJA_LIST, 0).as.list;
    for (size_t i = 0; i < items->count; i++) {
        jinja_value key = given[1] && v[1].kind != JINJA_NONE ? get_path(ctx, items->items[i], v[1]) : items->items[i];
        key = sort_key(ctx, key, case_sensitive);
        jinja_check_hashable(ctx, key); /* unique() keeps a set of what it has seen */
        bool found = false;
        for (size_t k = 0; k < seen->count && !found; k++) found = jinja_equal(ctx, seen->items[k], key);
        jinja_count_steps(ctx, seen->count);
        if (found) continue;
        jinja_list_push(ctx, seen, key);
        jinja_list_push(ctx, out, items->items[i]);
    }
    return jinja_new_iterator(ctx, out);
}

static jinja_value filter_min_max(jinja_render_context *ctx, jinja_value input, const arguments *a, bool want_max) {
    static const char *const params[] = {"case_sensitive", "attribute", NULL};
    jinja_value v[2];
    bool given[2];
    bind(ctx, want_max ? "max" : "min", a, params, v, given);
    const jinja_list *items = jinja_iterate(ctx, input);
    if (items->count == 0) return jinja_undefined("No aggregated item, sequence was empty.");
    size_t best = 0;
    jinja_value best_key = jinja_none();
    for (size_t i = 0; i < items->count; i++) {
        jinja_value key = given[1] && v[1].kind != JINJA_NONE ? get_path(ctx, items->items[i], v[1]) : items->items[i];
        key = sort_key(ctx, key, given[0] && jinja_truthy(v[0]));
        if (i == 0 || (want_max ? jinja_compare(ctx, key, best_key) > 0 : jinja_compare(ctx, key, best_key) < 0)) {
            best = i;
            best_key = key;
        }
    }
    return items->items[best];
}

static jinja_value filter_tojson(jinja_render_context *ctx, jinja_value input, const arguments *a) {
    static const char *const params[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    jinja_value v[4];
    bool given[4];
    bind(ctx, "tojson", a, params, v, given);
    if (given[0] && jinja_truthy(v[0])) jinja_runtime_error(ctx, "tojson(ensure_ascii=True) is not supported by kite");
    /* json.dumps: an int indent is that many spaces a level (negative: none), a string is used as it is. */
    const char *indent = NULL;
    if (given[1] && v[1].kind != JINJA_NONE) {
        if (v[1].kind == JINJA_STRING) {
            indent = jinja_arena_strndup(&ctx->arena, v[1].as.string.data, v[1].as.string.length);
        } else {
            int64_t n = need_int(ctx, "tojson indent", v[1]);
            if (n > 64) jinja_runtime_error(ctx, "tojson indent %lld is past kite's limit of 64", (long long)n);
            char *spaces = jinja_arena_alloc(&ctx->arena, 65);
            memset(spaces, ' ', n > 0 ? (size_t)n : 0);
            indent = spaces;
        }
    }
    const char *item_sep = indent ? "," : ", ", *key_sep = ": ";
    if (given[2] && v[2].kind != JINJA_NONE) {
        if ((v[2].kind != JINJA_LIST && v[2].kind != JINJA_TUPLE) || v[2].as.list->count != 2)
            jinja_runtime_error(ctx, "tojson separators must be a pair of strings");
        jinja_value item = need_string(ctx, "tojson separator", v[2].as.list->items[0]);
        jinja_value key = need_string(ctx, "tojson separator", v[2].as.list->items[1]);
        item_sep = jinja_arena_strndup(&ctx->arena, item.as.string.data, item.as.string.length);
        key_sep = jinja_arena_strndup(&ctx->arena, key.as.string.data, key.as.string.length);
    }
    /* A capture slot holds the text, so an error in the middle cannot leak it. */
    text_builder *slot = jinja_capture_push(ctx);
    jinja_write_json(ctx, slot, input, indent, item_sep, key_sep, given[3] && jinja_truthy(v[3]), 0);
    return jinja_capture_pop(ctx);
}

static jinja_value filter_indent(jinja_render_context *ctx, jinja_value input, const arguments *a) {
    static const char *const params[] = {"width", "first", "blank", NULL};
    jinja_value v[3];
    bool given[3];
    bind(ctx, "indent", a, params, v, given);
    jinja_value prefix;
    if (given[0] && v[0].kind == JINJA_STRING) {
        prefix = v[0];
    } else {
        int64_t width = given[0] ? need_int(ctx, "indent width", v[0]) : 4;
        if (width < 0) width = 0;
        if (width > 4096) jinja_runtime_error(ctx, "indent width %lld is past kite's limit", (long long)width);
        char *spaces = jinja_arena_alloc(&ctx->arena, (size_t)width + 1);
        memset(spaces, ' ', (size_t)width);
        prefix = jinja_string(spaces, (size_t)width);
    }
    bool first = given[1] && jinja_truthy(v[1]), blank = given[2] && jinja_truthy(v[2]);
    jinja_value s = need_string(ctx, "indent", input); /* jinja2 appends "\n" to it: only text works */
    /* jinja2 appends "\n" before splitlines(), so a trailing newline yields no extra line. */
    string_builder with_newline = {0};
    sb_append(ctx, &with_newline, s.as.string.data, s.as.string.length);
    sb_append(ctx, &with_newline, "\n", 1);
    jinja_list *lines = python_splitlines(ctx, sb_value(&with_newline), false);
    string_builder b = {0};
    for (size_t i = 0; i < lines->count; i++) {
        jinja_value line = lines->items[i];
        if (i) sb_append(ctx, &b, "\n", 1);
        bool indent_this = i == 0 ? first : (blank || line.as.string.length > 0);
        if (indent_this) sb_append(ctx, &b, prefix.as.string.data, prefix.as.string.length);
        sb_append(ctx, &b, line.as.string.data, line.as.string.length);
    }
    jinja_count_steps(ctx, lines->count);
    sb_append(ctx, &b, "", 0);
    return sb_value(&b);
}

/* Python's int(str, base) for base 10 (surrounding whitespace, a sign, digits with single underscores). */
static bool parse_python_int(const char *s, size_t n, int base, int64_t *out) {
    size_t i = 0;
    while (i < n && jinja_is_python_space((unsigned char)s[i])) i++;
    while (n > i && jinja_is_python_space((unsigned char)s[n - 1])) n--;
    bool negative = false;
    if (i < n && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
    if (base == 16 && i + 1 < n && s[i] == '0' && (s[i + 1] | 0x20) == 'x') i += 2;
    if (base == 8 && i + 1 < n && s[i] == '0' && (s[i + 1] | 0x20) == 'o') i += 2;
    if (base == 2 && i + 1 < n && s[i] == '0' && (s[i + 1] | 0x20) == 'b') i += 2;
    if (i >= n) return false;
    uint64_t value = 0;
    bool last_underscore = true;
    for (; i < n; i++) {
        char c = s[i];
        if (c == '_') {
            if (last_underscore) return false;
            last_underscore = true;
            continue;
        }
        int digit = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? (c | 0x20) - 'a' + 10 : 99;
        if (digit >= base) return false;
        if (value > (UINT64_MAX - (uint64_t)digit) / (uint64_t)base) return false;
        value = value * (uint64_t)base + (uint64_t)digit;
        last_underscore = false;
    }
    if (last_underscore) return false;
    if (value > (uint64_t)INT64_MAX + (negative ? 1u : 0u)) return false;
    *out = negative ? (int64_t)(0 - value) : (int64_t)value;
    return true;
}

/* Python's float(str): surrounding whitespace, inf/nan/infinity words, the usual decimal forms. */
static bool parse_python_float(jinja_render_context *ctx, jinja_value s, double *out) {
    jinja_value t = python_strip(s, jinja_none(), true, true);
    if (t.as.string.length == 0 || memchr(t.as.string.data, '_', t.as.string.length)) return false;
    char *text = jinja_arena_strndup(&ctx->arena, t.as.string.data, t.as.string.length);
    for (char *c = text; *c; c++)
        if (*c == 'x' || *c == 'X' || *c == 'p' || *c == 'P') return false; /* strtod's hex floats */
    char *end = NULL;
    double v = strtod(text, &end);
    if (!end || *end != '\0') return false;
    *out = v;
    return true;
}

static jinja_value filter_int(jinja_render_context *ctx, jinja_value input, const arguments *a) {
    static const char *const params[] = {"default", "base", NULL};
    jinja_value v[2];
    bool given[2];
    bind(ctx, "int", a, params, v, given);
    jinja_check_defined(ctx, input); /* int(Undefined) raises */
    jinja_value fallback = given[0] ? v[0] : jinja_int(0);
    int64_t base = given[1] ? need_int(ctx, "int base", v[1]) : 10;
    if (base < 2 || base > 36) jinja_runtime_error(ctx, "int() base must be >= 2 and <= 36");
    switch (input.kind) {
    case JINJA_INT:
    case JINJA_BIG_INT: return input;
    case JINJA_BOOL: return jinja_int(input.as.boolean);
    case JINJA_FLOAT:
        if (!isfinite(input.as.number)) jinja_runtime_error(ctx, "cannot convert float infinity or NaN to integer");
        if (fabs(input.as.number) >= 9.2e18) jinja_runtime_error(ctx, "integer overflow (kite's integers are 64-bit)");
        return jinja_int((int64_t)input.as.number);
    case JINJA_STRING: {
        int64_t n;
        if (parse_python_int(input.as.string.data, input.as.string.length, (int)base, &n)) return jinja_int(n);
        double d;
        if (parse_python_float(ctx, input, &d)) {
            if (!isfinite(d)) jinja_runtime_error(ctx, "cannot convert float infinity or NaN to integer");
            if (fabs(d) >= 9.2e18) jinja_runtime_error(ctx, "integer overflow (kite's integers are 64-bit)");
            return jinja_int((int64_t)d);
        }
        return fallback;
    }
    default: return fallback;
    }
}

static jinja_value filter_float(jinja_render_context *ctx, jinja_value input, const arguments *a) {
    static const char *const params[] = {"default", NULL};
    jinja_value v[1];
    bool given[1];
    bind(ctx, "float", a, params, v, given);
    jinja_check_defined(ctx, input); /* float(Undefined) raises */
    jinja_value fallback = given[0] ? v[0] : jinja_float(0.0);
    if (is_number(input)) return jinja_float(float_of(input));
    if (input.kind == JINJA_BIG_INT) return jinja_float(strtod(input.as.string.data, NULL)); /* digits end in NUL */
    double d;
    if (input.kind == JINJA_STRING && parse_python_float(ctx, input, &d)) return jinja_float(d);
    return fallback;
}

static jinja_value filter_round(jinja_render_context *ctx, jinja_value input, const arguments *a) {
    static const char *const params[] = {"precision", "method", NULL};
    jinja_value v[2];
    bool given[2];
    bind(ctx, "round", a, params, v, given);
    int64_t precision = given[0] ? need_int(ctx, "round precision", v[0]) : 0;
    const char *method = "common";
    if (given[1]) {
        jinja_value m = need_string(ctx, "round method", v[1]);
        method = jinja_arena_strndup(&ctx->arena, m.as.string.data, m.as.string.length);
    }
    if (strcmp(method, "common") && strcmp(method, "floor") && strcmp(method, "ceil"))
        jinja_runtime_error(ctx, "method must be common, ceil or floor");
    jinja_check_defined(ctx, input);
    if (!is_number(input)) jinja_runtime_error(ctx, "type %s doesn't define __round__ method", jinja_type_name(input));
    if (precision < -300 || precision > 300) jinja_runtime_error(ctx, "round precision %lld is past kite's limit", (long long)precision);
    if (!strcmp(method, "common")) {
        if (is_int(input)) {
            if (precision >= 0) return jinja_int(int_of(input));
            jinja_runtime_error(ctx, "round() of an integer to a negative precision is not supported by kite");
        }
        double x = input.as.number;
        if (!isfinite(x)) return input;
        if (precision == 0) return jinja_float(nearbyint(x)); /* half to even, as Python's round() */
        if (precision < 0) jinja_runtime_error(ctx, "round() to a negative precision is not supported by kite");
        /* glibc prints the exact binary value rounded half to even, which is Python's round(x, n). */
        char digits[400];
        snprintf(digits, sizeof digits, "%.*f", (int)precision, x);
        return jinja_float(strtod(digits, NULL));
    }
    double scale = pow(10.0, (double)precision);
    double x = float_of(input) * scale;
    x = !strcmp(method, "floor") ? floor(x) : ceil(x);
    return jinja_float(x / scale);
}

static jinja_value filter_batch(jinja_render_context *ctx, jinja_value input, const arguments *a) {
    static const char *const params[] = {"linecount", "fill_with", NULL};
    jinja_value v[2];
    bool given[2];
    bind(ctx, "batch", a, params, v, given);
    if (!given[0]) jinja_runtime_error(ctx, "batch needs a line count");
    int64_t size = need_int(ctx, "batch linecount", v[0]);
    if (size <= 0) jinja_runtime_error(ctx, "batch linecount must be positive");
    const jinja_list *items = jinja_iterate(ctx, input);
    jinja_list *out = jinja_new_list(ctx, JINJA_LIST, 0).as.list;
    jinja_value row = jinja_none();
    for (size_t i = 0; i < items->count; i++) {
        if (i % (uint64_t)size == 0) {
            row = jinja_new_list(ctx, JINJA_LIST, 0);
            jinja_list_push(ctx, out, row);
        }
        jinja_list_push(ctx, row.as.list, items->items[i]);
    }
    if (given[1] && v[1].kind != JINJA_NONE && row.kind == JINJA_LIST)
        while (row.as.list->count < (uint64_t)size) jinja_list_push(ctx, row.as.list, v[1]);
    jinja_count_steps(ctx, items->count);
    return jinja_new_iterator(ctx, out);
}

static jinja_value filter_sum(jinja_render_context *ctx, jinja_value input, const arguments *a) {
    static const char *const params[] = {"attribute", "start", NULL};
    jinja_value v[2];
    bool given[2];
    bind(ctx, "sum", a, params, v, given);
    jinja_value total = given[1] ? v[1] : jinja_int(0);
    const jinja_list *items = jinja_iterate(ctx, input);
    for (size_t i = 0; i < items->count; i++) {
        jinja_value item = given[0] && v[0].kind != JINJA_NONE ? get_path(ctx, items->items[i], v[0]) : items->items[i];
        if (!is_number(total) || !is_number(item)) {
            jinja_check_defined(ctx, item);
            jinja_runtime_error(ctx, "unsupported operand type(s) for +: '%s' and '%s'", jinja_type_name(total),
                                jinja_type_name(item));
        }
        if (is_int(total) && is_int(item)) {
            int64_t r;
            if (__builtin_add_overflow(int_of(total), int_of(item), &r))
                jinja_runtime_error(ctx, "integer overflow (kite's integers are 64-bit)");
            total = jinja_int(r);
        } else {
            total = jinja_float(float_of(total) + float_of(item));
        }
    }
    return total;
}

jinja_value jinja_apply_filter(jinja_render_context *ctx, int filter, jinja_value input, const jinja_value *args,
                               size_t n_args, const char **kwarg_names, const jinja_value *kwargs, size_t n_kwargs) {
    const arguments a = {args, n_args, kwarg_names, kwargs, n_kwargs};
    const char *name = filter_names[filter];
    jinja_value v[4];
    bool given[4];
    jinja_count_steps(ctx, 1);
    switch ((jinja_filter)filter) {
    case FILTER_ABS:
        no_arguments(ctx, name, &a);
        if (input.kind == JINJA_FLOAT) return jinja_float(fabs(input.as.number));
        if (is_int(input)) {
            if (int_of(input) == INT64_MIN) jinja_runtime_error(ctx, "integer overflow (kite's integers are 64-bit)");
            return jinja_int(int_of(input) < 0 ? -int_of(input) : int_of(input));
        }
        jinja_check_defined(ctx, input);
        jinja_runtime_error(ctx, "bad operand type for abs(): '%s'", jinja_type_name(input));
    case FILTER_ATTR: {
        static const char *const params[] = {"name", NULL};
        bind(ctx, name, &a, params, v, given);
        jinja_value attribute = need_string(ctx, "attr name", v[0]);
        const char *s = jinja_arena_strndup(&ctx->arena, attribute.as.string.data, attribute.as.string.length);
        jinja_check_defined(ctx, input);
        jinja_value out;
        if (s[0] != '_' && python_getattr(ctx, input, s, &out)) return out;
        return no_attribute(ctx, jinja_type_name(input), s);
    }
    case FILTER_BATCH: return filter_batch(ctx, input, &a);
    case FILTER_CAPITALIZE: no_arguments(ctx, name, &a); return python_capitalize(ctx, jinja_to_str(ctx, input));
    case FILTER_COUNT:
    case FILTER_LENGTH: no_arguments(ctx, name, &a); return jinja_int((int64_t)jinja_length(ctx, input));
    case FILTER_D:
    case FILTER_DEFAULT: {
        static const char *const params[] = {"default_value", "boolean", NULL};
        bind(ctx, name, &a, params, v, given);
        jinja_value fallback = given[0] ? v[0] : jinja_cstring("");
        bool boolean = given[1] && jinja_truthy(v[1]);
        if (input.kind == JINJA_UNDEFINED || (boolean && !jinja_truthy(input))) return fallback;
        return input;
    }
    case FILTER_DICTSORT: return filter_dictsort(ctx, input, &a);
    case FILTER_E:
    case FILTER_ESCAPE:
        no_arguments(ctx, name, &a);
        if (input.kind == JINJA_STRING && input.markup) return input; /* already escaped */
        return jinja_html_escape(ctx, jinja_to_str(ctx, input));
    case FILTER_FIRST: {
        no_arguments(ctx, name, &a);
        if (input.kind == JINJA_ITERATOR) {
            /* next(): one item consumed */
            jinja_iterator *it = input.as.iterator;
            if (it->position < it->items->count) return it->items->items[it->position++];
            return jinja_undefined("No first item, sequence was empty.");
        }
        const jinja_list *items = jinja_iterate(ctx, input);
        return items->count ? items->items[0] : jinja_undefined("No first item, sequence was empty.");
    }
    case FILTER_LAST: {
        no_arguments(ctx, name, &a);
        if (input.kind == JINJA_ITERATOR) jinja_runtime_error(ctx, "'generator' object is not reversible");
        const jinja_list *items = jinja_iterate(ctx, input);
        return items->count ? items->items[items->count - 1] : jinja_undefined("No last item, sequence was empty.");
    }
    case FILTER_FLOAT: return filter_float(ctx, input, &a);
    case FILTER_INDENT: return filter_indent(ctx, input, &a);
    case FILTER_INT: return filter_int(ctx, input, &a);
    case FILTER_ITEMS: {
        no_arguments(ctx, name, &a);
        jinja_list *pairs = jinja_new_list(ctx, JINJA_LIST, 0).as.list;
        if (input.kind == JINJA_UNDEFINED) return jinja_new_iterator(ctx, pairs);
        if (input.kind != JINJA_DICT) jinja_runtime_error(ctx, "Can only get item pairs from a mapping.");
        for (size_t i = 0; i < input.as.dict->count; i++) {
            jinja_value pair = jinja_new_list(ctx, JINJA_TUPLE, 2);
            jinja_list_push(ctx, pair.as.list, input.as.dict->keys[i]);
            jinja_list_push(ctx, pair.as.list, input.as.dict->values[i]);
            jinja_list_push(ctx, pairs, pair);
        }
        return jinja_new_iterator(ctx, pairs);
    }
    case FILTER_JOIN: {
        static const char *const params[] = {"d", "attribute", NULL};
        bind(ctx, name, &a, params, v, given);
        jinja_value separator = given[0] ? jinja_to_str(ctx, v[0]) : jinja_cstring("");
        const jinja_list *items = jinja_iterate(ctx, input);
        if (given[1] && v[1].kind != JINJA_NONE) {
            jinja_list *picked = jinja_new_list(ctx, JINJA_LIST, items->count).as.list;
            for (size_t i = 0; i < items->count; i++) jinja_list_push(ctx, picked, get_path(ctx, items->items[i], v[1]));
            items = picked;
        }
        return join_items(ctx, items, separator, false);
    }
    case FILTER_LIST: {
        no_arguments(ctx, name, &a);
        return (jinja_value){.kind = JINJA_LIST, .as.list = copy_list(ctx, jinja_iterate(ctx, input))};
    }
    case FILTER_LOWER: no_arguments(ctx, name, &a); return change_case(ctx, jinja_to_str(ctx, input), CASE_LOWER);
    case FILTER_UPPER: no_arguments(ctx, name, &a); return change_case(ctx, jinja_to_str(ctx, input), CASE_UPPER);
    case FILTER_MAP: return filter_map(ctx, input, &a);
    case FILTER_MAX: return filter_min_max(ctx, input, &a, true);
    case FILTER_MIN: return filter_min_max(ctx, input, &a, false);
    case FILTER_REJECT: return filter_select(ctx, input, &a, false, false);
    case FILTER_REJECTATTR: return filter_select(ctx, input, &a, true, false);
    case FILTER_SELECT: return filter_select(ctx, input, &a, false, true);
    case FILTER_SELECTATTR: return filter_select(ctx, input, &a, true, true);
    case FILTER_REPLACE: {
        static const char *const params[] = {"old", "new", "count", NULL};
        bind(ctx, name, &a, params, v, given);
        if (!given[0] || !given[1]) jinja_runtime_error(ctx, "replace needs old and new");
        jinja_value s = jinja_to_str(ctx, input);
        int64_t count = given[2] && v[2].kind != JINJA_NONE ? need_int(ctx, "replace count", v[2]) : -1;
        return python_replace(ctx, s, jinja_to_str(ctx, v[0]), jinja_to_str(ctx, v[1]), count);
    }
    case FILTER_REVERSE: {
        no_arguments(ctx, name, &a);
        if (input.kind == JINJA_STRING) {
            const jinja_list *chars = jinja_iterate(ctx, input);
            string_builder b = {0};
            for (size_t i = chars->count; i-- > 0;)
                sb_append(ctx, &b, chars->items[i].as.string.data, chars->items[i].as.string.length);
            sb_append(ctx, &b, "", 0);
            return sb_value(&b);
        }
        const jinja_list *items = jinja_iterate(ctx, input);
        jinja_list *out = jinja_new_list(ctx, JINJA_LIST, items->count).as.list;
        for (size_t i = items->count; i-- > 0;) jinja_list_push(ctx, out, items->items[i]);
        return jinja_new_iterator(ctx, out);
    }
    case FILTER_ROUND: return filter_round(ctx, input, &a);
    case FILTER_SAFE: {
        no_arguments(ctx, name, &a);
        jinja_value s = jinja_to_str(ctx, input);
        s.markup = true;
        return s;
    }
    case FILTER_STRING: no_arguments(ctx, name, &a); return jinja_to_str(ctx, input);
    case FILTER_SORT: return filter_sort(ctx, input, &a);
    case FILTER_SUM: return filter_sum(ctx, input, &a);
    case FILTER_TITLE: no_arguments(ctx, name, &a); return filter_title(ctx, jinja_to_str(ctx, input));
    case FILTER_TOJSON: return filter_tojson(ctx, input, &a);
    case FILTER_TRIM: {
        static const char *const params[] = {"chars", NULL};
        bind(ctx, name, &a, params, v, given);
        return python_strip(jinja_to_str(ctx, input), strip_chars_arg(ctx, "strip", v[0]), true, true);
    }
    case FILTER_UNIQUE: return filter_unique(ctx, input, &a);
    case FILTER_COUNT_OF: break;
    }
    jinja_runtime_error(ctx, "internal: unknown filter");
}

/* ---- methods ------------------------------------------------------------------------------------------------ */

static jinja_value string_method(jinja_render_context *ctx, jinja_value s, const char *name, const arguments *a) {
    jinja_value v[4];
    bool given[4];
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        static const char *const params[] = {"prefix", "start", "end", NULL};
        bind(ctx, name, a, params, v, given);
        if (!given[0]) jinja_runtime_error(ctx, "%s() takes at least 1 argument (0 given)", name);
        size_t from, to;
        substring_range(ctx, s, v + 1, given + 1, &from, &to);
        bool at_start = name[0] == 's';
        if (v[0].kind == JINJA_TUPLE) {
            for (size_t i = 0; i < v[0].as.list->count; i++)
                if (affix_matches(ctx, s, from, to, v[0].as.list->items[i], at_start)) return jinja_bool(true);
            return jinja_bool(false);
        }
        return jinja_bool(affix_matches(ctx, s, from, to, v[0], at_start));
    }
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
        static const char *const params[] = {"sep", "maxsplit", NULL};
        bind(ctx, name, a, params, v, given);
        jinja_value sep = given[0] ? v[0] : jinja_none();
        if (sep.kind != JINJA_NONE) need_string(ctx, "split separator", sep);
        int64_t maxsplit = given[1] ? need_int(ctx, "maxsplit", v[1]) : -1;
        return python_split(ctx, s, sep, maxsplit, name[0] == 'r');
    }
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        static const char *const params[] = {"chars", NULL};
        bind(ctx, name, a, params, v, given);
        jinja_value chars = strip_chars_arg(ctx, name, v[0]);
        return python_strip(s, chars, name[0] != 'r', name[0] != 'l');
    }
    if (!strcmp(name, "replace")) {
        static const char *const params[] = {"old", "new", "count", NULL};
        bind(ctx, name, a, params, v, given);
        if (!given[0] || !given[1]) jinja_runtime_error(ctx, "replace expected at least 2 arguments");
        int64_t count = given[2] ? need_int(ctx, "replace count", v[2]) : -1;
        return python_replace(ctx, s, need_string(ctx, "replace", v[0]), need_string(ctx, "replace", v[1]), count);
    }
    if (!strcmp(name, "upper") || !strcmp(name, "lower")) {
        no_arguments(ctx, name, a);
        return change_case(ctx, s, name[0] == 'u' ? CASE_UPPER : CASE_LOWER);
    }
    if (!strcmp(name, "title")) {
        no_arguments(ctx, name, a);
        return python_title(ctx, s);
    }
    if (!strcmp(name, "capitalize")) {
        no_arguments(ctx, name, a);
        return python_capitalize(ctx, s);
    }
    if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "index") || !strcmp(name, "rindex") ||
        !strcmp(name, "count")) {
        static const char *const params[] = {"sub", "start", "end", NULL};
        bind(ctx, name, a, params, v, given);
        if (!given[0]) jinja_runtime_error(ctx, "%s() takes at least 1 argument (0 given)", name);
        jinja_value sub = need_string(ctx, name, v[0]);
        size_t from, to;
        substring_range(ctx, s, v + 1, given + 1, &from, &to);
        bool from_right = name[0] == 'r';
        if (!strcmp(name, "count")) {
            if (from > s.as.string.length || to < from) return jinja_int(0);
            if (sub.as.string.length == 0)
                return jinja_int((int64_t)jinja_utf8_count(s.as.string.data + from, to - from) + 1);
            int64_t count = 0;
            for (size_t at = from; at + sub.as.string.length <= to;) {
                const char *hit = find_bytes(s.as.string.data + at, to - at, sub.as.string.data, sub.as.string.length);
                if (!hit) break;
                count++;
                at = (size_t)(hit - s.as.string.data) + sub.as.string.length;
            }
            return jinja_int(count);
        }
        const char *hit = NULL;
        if (from <= s.as.string.length && to >= from)
            hit = from_right ? rfind_bytes(s.as.string.data + from, to - from, sub.as.string.data, sub.as.string.length)
                             : find_bytes(s.as.string.data + from, to - from, sub.as.string.data, sub.as.string.length);
        if (!hit) {
            if (strstr(name, "index")) jinja_runtime_error(ctx, "substring not found");
            return jinja_int(-1);
        }
        return jinja_int((int64_t)jinja_utf8_count(s.as.string.data, (size_t)(hit - s.as.string.data)));
    }
    if (!strcmp(name, "join")) {
        static const char *const params[] = {"iterable", NULL};
        bind(ctx, name, a, params, v, given);
        if (!given[0]) jinja_runtime_error(ctx, "join() takes exactly one argument (0 given)");
        return join_items(ctx, jinja_iterate(ctx, v[0]), s, true);
    }
    if (!strcmp(name, "splitlines")) {
        static const char *const params[] = {"keepends", NULL};
        bind(ctx, name, a, params, v, given);
        return (jinja_value){.kind = JINJA_LIST, .as.list = python_splitlines(ctx, s, given[0] && jinja_truthy(v[0]))};
    }
    if (!strcmp(name, "removeprefix") || !strcmp(name, "removesuffix")) {
        static const char *const params[] = {"affix", NULL};
        bind(ctx, name, a, params, v, given);
        if (!given[0]) jinja_runtime_error(ctx, "%s() takes exactly one argument (0 given)", name);
        jinja_value affix = need_string(ctx, name, v[0]);
        size_t n = s.as.string.length, m = affix.as.string.length;
        bool prefix = !strcmp(name, "removeprefix");
        if (m <= n && memcmp(s.as.string.data + (prefix ? 0 : n - m), affix.as.string.data, m) == 0)
            return jinja_string(s.as.string.data + (prefix ? m : 0), n - m);
        return s;
    }
    no_arguments(ctx, name, a);
    if (!strcmp(name, "isalpha")) return jinja_bool(all_code_points(s, cp_alpha));
    if (!strcmp(name, "isdigit")) return jinja_bool(all_code_points(s, cp_digit));
    if (!strcmp(name, "isalnum")) return jinja_bool(all_code_points(s, cp_alnum));
    if (!strcmp(name, "isspace")) return jinja_bool(all_code_points(s, cp_space));
    if (!strcmp(name, "isupper")) return jinja_bool(python_is_case(s, true));
    if (!strcmp(name, "islower")) return jinja_bool(python_is_case(s, false));
    jinja_runtime_error(ctx, "internal: unknown str method '%s'", name);
}

jinja_value jinja_call_method(jinja_render_context *ctx, const jinja_method *method, const jinja_value *args,
                              size_t n_args, const char **kwarg_names, const jinja_value *kwargs, size_t n_kwargs) {
    const arguments a = {args, n_args, kwarg_names, kwargs, n_kwargs};
    const char *name = method->name;
    jinja_value self = method->self;
    jinja_value v[2];
    bool given[2];
    switch (self.kind) {
    case JINJA_STRING: return string_method(ctx, self, name, &a);
    case JINJA_DICT: {
        const jinja_dict *d = self.as.dict;
        if (!strcmp(name, "get")) {
            static const char *const params[] = {"key", "default", NULL};
            bind(ctx, name, &a, params, v, given);
            if (!given[0]) jinja_runtime_error(ctx, "get expected at least 1 argument, got 0");
            jinja_check_hashable(ctx, v[0]);
            jinja_value *found = jinja_dict_get(self.as.dict, v[0]);
            return found ? *found : given[1] ? v[1] : jinja_none();
        }
        no_arguments(ctx, name, &a);
        jinja_value out = jinja_new_list(ctx, JINJA_LIST, d->count);
        for (size_t i = 0; i < d->count; i++) {
            if (!strcmp(name, "keys")) {
                jinja_list_push(ctx, out.as.list, d->keys[i]);
            } else if (!strcmp(name, "values")) {
                jinja_list_push(ctx, out.as.list, d->values[i]);
            } else {
                jinja_value pair = jinja_new_list(ctx, JINJA_TUPLE, 2);
                jinja_list_push(ctx, pair.as.list, d->keys[i]);
                jinja_list_push(ctx, pair.as.list, d->values[i]);
                jinja_list_push(ctx, out.as.list, pair);
            }
        }
        jinja_count_steps(ctx, d->count);
        return out;
    }
    case JINJA_LIST:
    case JINJA_TUPLE: {
        static const char *const params[] = {"value", NULL};
        bind(ctx, name, &a, params, v, given);
        if (!given[0]) jinja_runtime_error(ctx, "%s() takes exactly one argument (0 given)", name);
        const jinja_list *items = self.as.list;
        int64_t count = 0;
        jinja_count_steps(ctx, items->count);
        for (size_t i = 0; i < items->count; i++)
            if (jinja_equal(ctx, items->items[i], v[0])) {
                if (!strcmp(name, "index")) return jinja_int((int64_t)i);
                count++;
            }
        if (!strcmp(name, "index")) jinja_runtime_error(ctx, "%s.index(x): x not in %s", jinja_type_name(self), jinja_type_name(self));
        return jinja_int(count);
    }
    case JINJA_LOOP: {
        /* loop.cycle(a, b, ...) */
        if (n_kwargs) jinja_runtime_error(ctx, "loop.cycle takes no keyword arguments");
        if (n_args == 0) jinja_runtime_error(ctx, "no items for cycling given");
        return args[self.as.loop->index0 % n_args];
    }
    default: jinja_runtime_error(ctx, "internal: method '%s' of a %s", name, jinja_type_name(self));
    }
}

/* ---- global functions --------------------------------------------------------------------------------------- */

jinja_value jinja_call_function(jinja_render_context *ctx, int function, const jinja_value *args, size_t n_args,
                                const char **kwarg_names, const jinja_value *kwargs, size_t n_kwargs) {
    const arguments a = {args, n_args, kwarg_names, kwargs, n_kwargs};
    jinja_value v[3];
    bool given[3];
    switch ((jinja_function)function) {
    case JINJA_FUNCTION_RAISE_EXCEPTION: {
        static const char *const params[] = {"message", NULL};
        bind(ctx, "raise_exception", &a, params, v, given);
        jinja_value message = jinja_to_str(ctx, v[0]);
        jinja_runtime_error(ctx, "%.*s", (int)(message.as.string.length > 600 ? 600 : message.as.string.length),
                            message.as.string.data);
    }
    case JINJA_FUNCTION_STRFTIME_NOW: {
        static const char *const params[] = {"format", NULL};
        bind(ctx, "strftime_now", &a, params, v, given);
        jinja_value format = need_string(ctx, "strftime_now format", v[0]);
        const char *f = jinja_arena_strndup(&ctx->arena, format.as.string.data, format.as.string.length);
        time_t now = time(NULL);
        struct tm local;
        if (now == (time_t)-1 || !localtime_r(&now, &local)) jinja_runtime_error(ctx, "strftime_now: no local time");
        size_t capacity = 256 + 8 * format.as.string.length;
        char *out = jinja_arena_alloc(&ctx->arena, capacity);
        /* The format is the template's, as strftime_now passes it to Python's strftime. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        size_t n = strftime(out, capacity, f, &local);
#pragma GCC diagnostic pop
        if (n == 0 && format.as.string.length != 0 && f[0] != '\0')
            jinja_runtime_error(ctx, "strftime_now: the format gives nothing or too much");
        return jinja_string(out, n);
    }
    case JINJA_FUNCTION_NAMESPACE:
    case JINJA_FUNCTION_DICT: {
        jinja_value ns = jinja_new_dict(ctx, function == JINJA_FUNCTION_NAMESPACE ? JINJA_NAMESPACE : JINJA_DICT);
        if (n_args > 1) jinja_runtime_error(ctx, "expected at most 1 positional argument, got %zu", n_args);
        if (n_args == 1) {
            if (args[0].kind != JINJA_DICT) jinja_runtime_error(ctx, "a namespace or dict takes a mapping, not '%s'", jinja_type_name(args[0]));
            for (size_t i = 0; i < args[0].as.dict->count; i++)
                jinja_dict_set(ctx, ns.as.dict, args[0].as.dict->keys[i], args[0].as.dict->values[i]);
        }
        for (size_t k = 0; k < n_kwargs; k++) jinja_dict_set(ctx, ns.as.dict, jinja_cstring(kwarg_names[k]), kwargs[k]);
        return ns;
    }
    case JINJA_FUNCTION_RANGE: {
        if (n_kwargs) jinja_runtime_error(ctx, "range() takes no keyword arguments");
        if (n_args < 1 || n_args > 3) jinja_runtime_error(ctx, "range expected 1 to 3 arguments, got %zu", n_args);
        int64_t start = 0, stop, step = 1;
        if (n_args == 1) {
            stop = need_int(ctx, "range", args[0]);
        } else {
            start = need_int(ctx, "range", args[0]);
            stop = need_int(ctx, "range", args[1]);
            if (n_args == 3) step = need_int(ctx, "range", args[2]);
        }
        if (step == 0) jinja_runtime_error(ctx, "range() arg 3 must not be zero");
        /* Counted in floating point: the difference of two int64 can overflow. */
        double span = step > 0 ? (double)stop - (double)start : (double)start - (double)stop;
        double count = span <= 0 ? 0 : ceil(span / fabs((double)step));
        if (count > JINJA_MAX_RANGE)
            jinja_runtime_error(ctx, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", JINJA_MAX_RANGE);
        jinja_value out = jinja_new_list(ctx, JINJA_LIST, (size_t)count);
        for (int64_t i = 0; i < (int64_t)count; i++) jinja_list_push(ctx, out.as.list, jinja_int(start + i * step));
        jinja_count_steps(ctx, (uint64_t)count);
        return out;
    }
    }
    jinja_runtime_error(ctx, "internal: unknown function");
}

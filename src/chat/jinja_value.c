/* The interpreter's values and memory: the arena a parse or a render allocates from, UTF-8 helpers, and the
 * Python behaviour of values (truthiness, ==, ordering, str(), repr(), len(), iteration, json.dumps).
 *
 * Values are small structs passed by value; strings, lists and dicts point into the render's arena, so nothing
 * is freed one by one and nothing leaks when an error unwinds. Lists and dicts never change once a template sees
 * them (the immutable sandbox refuses append/pop/update), except a namespace's attributes.
 * Integers are int64 (Python's are unbounded: an overflow is a runtime error, never a wrong number).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "chat/jinja_internal.h"
#include "chat/python_json.h"
#include "util/error.h"

/* ---- arena ------------------------------------------------------------------------------------------------ */

struct jinja_arena_chunk {
    jinja_arena_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

#define ARENA_CHUNK_BYTES ((size_t)64 << 10)

void *jinja_arena_alloc(jinja_arena *arena, size_t size) {
    size = (size + 15) & ~(size_t)15;
    if (size > arena->limit || arena->used > arena->limit - size) {
        arena->status = kite_fail(KITE_ERROR_INVALID_INPUT, "template: memory limit of %zu MiB exceeded",
                                           arena->limit >> 20);
        longjmp(*arena->on_fail, 1);
    }
    jinja_arena_chunk *chunk = arena->chunks;
    if (!chunk || chunk->size - chunk->used < size) {
        size_t chunk_size = size > ARENA_CHUNK_BYTES / 4 ? size : ARENA_CHUNK_BYTES;
        jinja_arena_chunk *fresh = malloc(sizeof *fresh + chunk_size);
        if (!fresh) {
            arena->status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "template: out of memory");
            longjmp(*arena->on_fail, 1);
        }
        fresh->size = chunk_size;
        fresh->used = 0;
        if (chunk && size > ARENA_CHUNK_BYTES / 4) {
            /* A big block gets a chunk of its own behind the current one, which keeps its free room. */
            fresh->next = chunk->next;
            chunk->next = fresh;
        } else {
            fresh->next = chunk;
            arena->chunks = fresh;
        }
        chunk = fresh;
    }
    void *p = chunk->data + chunk->used;
    chunk->used += size;
    arena->used += size;
    memset(p, 0, size);
    return p;
}

char *jinja_arena_strndup(jinja_arena *arena, const char *text, size_t length) {
    char *copy = jinja_arena_alloc(arena, length + 1);
    if (length) memcpy(copy, text, length);
    copy[length] = '\0';
    return copy;
}

void jinja_arena_free(jinja_arena *arena) {
    for (jinja_arena_chunk *c = arena->chunks; c;) {
        jinja_arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    arena->chunks = NULL;
    arena->used = 0;
}

/* ---- UTF-8 ------------------------------------------------------------------------------------------------ */

uint32_t jinja_utf8_next(const char *text, size_t length, size_t *at) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = *at;
    unsigned char c = s[i];
    int extra = c >= 0xF0 && c < 0xF8 ? 3 : c >= 0xE0 && c < 0xF0 ? 2 : c >= 0xC0 && c < 0xE0 ? 1 : 0;
    if (extra == 0 || i + (size_t)extra >= length) {
        *at = i + 1;
        return c;
    }
    uint32_t code_point = c & (0x3F >> extra);
    for (int k = 1; k <= extra; k++) {
        if ((s[i + (size_t)k] & 0xC0) != 0x80) {
            *at = i + 1;
            return c;
        }
        code_point = (code_point << 6) | (s[i + (size_t)k] & 0x3F);
    }
    *at = i + 1 + (size_t)extra;
    return code_point;
}

size_t jinja_utf8_put(char *out, uint32_t c) {
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

size_t jinja_utf8_count(const char *text, size_t length) {
    size_t n = 0;
    for (size_t at = 0; at < length; n++) jinja_utf8_next(text, length, &at);
    return n;
}

bool jinja_is_python_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* ---- constructors ----------------------------------------------------------------------------------------- */

jinja_value jinja_undefined(const char *message) {
    return (jinja_value){.kind = JINJA_UNDEFINED, .as.string = {message, message ? strlen(message) : 0}};
}
jinja_value jinja_none(void) { return (jinja_value){.kind = JINJA_NONE}; }
jinja_value jinja_bool(bool value) { return (jinja_value){.kind = JINJA_BOOL, .as.boolean = value}; }
jinja_value jinja_int(int64_t value) { return (jinja_value){.kind = JINJA_INT, .as.integer = value}; }
jinja_value jinja_float(double value) { return (jinja_value){.kind = JINJA_FLOAT, .as.number = value}; }
jinja_value jinja_string(const char *data, size_t length) {
    return (jinja_value){.kind = JINJA_STRING, .as.string = {data, length}};
}
jinja_value jinja_string_copy(jinja_render_context *ctx, const char *data, size_t length) {
    return jinja_string(jinja_arena_strndup(&ctx->arena, data, length), length);
}
jinja_value jinja_cstring(const char *text) { return jinja_string(text, strlen(text)); }

jinja_value jinja_new_list(jinja_render_context *ctx, jinja_kind kind, size_t capacity) {
    jinja_list *list = jinja_arena_alloc(&ctx->arena, sizeof *list);
    if (capacity) {
        if (capacity > JINJA_MAX_ARENA_BYTES / sizeof(jinja_value))
            jinja_runtime_error(ctx, "a list of %zu items is past the memory limit", capacity);
        list->items = jinja_arena_alloc(&ctx->arena, capacity * sizeof(jinja_value));
        list->capacity = capacity;
    }
    return (jinja_value){.kind = kind, .as.list = list};
}

jinja_value jinja_new_dict(jinja_render_context *ctx, jinja_kind kind) {
    jinja_dict *dict = jinja_arena_alloc(&ctx->arena, sizeof *dict);
    return (jinja_value){.kind = kind, .as.dict = dict};
}

jinja_value jinja_new_iterator(jinja_render_context *ctx, jinja_list *items) {
    jinja_iterator *it = jinja_arena_alloc(&ctx->arena, sizeof *it);
    it->items = items;
    return (jinja_value){.kind = JINJA_ITERATOR, .as.iterator = it};
}

void jinja_list_push(jinja_render_context *ctx, jinja_list *list, jinja_value item) {
    if (list->count == list->capacity) {
        size_t capacity = list->capacity ? list->capacity * 2 : 8;
        if (capacity > JINJA_MAX_ARENA_BYTES / sizeof(jinja_value))
            jinja_runtime_error(ctx, "a list of %zu items is past the memory limit", capacity);
        jinja_value *grown = jinja_arena_alloc(&ctx->arena, capacity * sizeof *grown);
        if (list->count) memcpy(grown, list->items, list->count * sizeof *grown);
        list->items = grown;
        list->capacity = capacity;
    }
    list->items[list->count++] = item;
}

/* Python's hash equality for keys: 1, 1.0 and True are one key. */
static bool keys_equal(jinja_value a, jinja_value b) {
    if (a.kind == JINJA_STRING && b.kind == JINJA_STRING)
        return a.as.string.length == b.as.string.length &&
               memcmp(a.as.string.data, b.as.string.data, a.as.string.length) == 0;
    bool a_number = a.kind == JINJA_INT || a.kind == JINJA_BOOL || a.kind == JINJA_FLOAT;
    bool b_number = b.kind == JINJA_INT || b.kind == JINJA_BOOL || b.kind == JINJA_FLOAT;
    if (a_number && b_number) {
        double x = a.kind == JINJA_FLOAT ? a.as.number : a.kind == JINJA_INT ? (double)a.as.integer : a.as.boolean;
        double y = b.kind == JINJA_FLOAT ? b.as.number : b.kind == JINJA_INT ? (double)b.as.integer : b.as.boolean;
        if (a.kind != JINJA_FLOAT && b.kind != JINJA_FLOAT) {
            int64_t i = a.kind == JINJA_INT ? a.as.integer : a.as.boolean;
            int64_t j = b.kind == JINJA_INT ? b.as.integer : b.as.boolean;
            return i == j;
        }
        return x == y;
    }
    if (a.kind == JINJA_NONE && b.kind == JINJA_NONE) return true;
    return false;
}

static void check_hashable_at(jinja_render_context *ctx, jinja_value v, int depth) {
    jinja_check_defined(ctx, v);
    if (v.kind == JINJA_LIST || v.kind == JINJA_DICT || v.kind == JINJA_NAMESPACE || v.kind == JINJA_ITERATOR)
        jinja_runtime_error(ctx, "unhashable type: '%s'", jinja_type_name(v));
    if (v.kind != JINJA_TUPLE) return;
    if (depth > JSON_MAX_DEPTH) jinja_runtime_error(ctx, "a tuple nested too deeply");
    for (size_t i = 0; i < v.as.list->count; i++) check_hashable_at(ctx, v.as.list->items[i], depth + 1);
}

void jinja_check_hashable(jinja_render_context *ctx, jinja_value v) { check_hashable_at(ctx, v, 0); }

jinja_value *jinja_dict_get(jinja_dict *dict, jinja_value key) {
    for (size_t i = 0; i < dict->count; i++)
        if (keys_equal(dict->keys[i], key)) return &dict->values[i];
    return NULL;
}

jinja_value *jinja_dict_get_string(jinja_dict *dict, const char *key) {
    return jinja_dict_get(dict, jinja_cstring(key));
}

void jinja_dict_set(jinja_render_context *ctx, jinja_dict *dict, jinja_value key, jinja_value value) {
    jinja_value *existing = jinja_dict_get(dict, key);
    if (existing) {
        *existing = value;
        return;
    }
    if (dict->count == dict->capacity) {
        size_t capacity = dict->capacity ? dict->capacity * 2 : 8;
        jinja_value *keys = jinja_arena_alloc(&ctx->arena, capacity * sizeof *keys);
        jinja_value *values = jinja_arena_alloc(&ctx->arena, capacity * sizeof *values);
        if (dict->count) {
            memcpy(keys, dict->keys, dict->count * sizeof *keys);
            memcpy(values, dict->values, dict->count * sizeof *values);
        }
        dict->keys = keys;
        dict->values = values;
        dict->capacity = capacity;
    }
    dict->keys[dict->count] = key;
    dict->values[dict->count] = value;
    dict->count++;
}

jinja_value jinja_from_json(jinja_render_context *ctx, const json_value *json, int depth) {
    switch (json->type) {
    case JSON_TYPE_NULL: return jinja_none();
    case JSON_TYPE_FALSE: return jinja_bool(false);
    case JSON_TYPE_TRUE: return jinja_bool(true);
    case JSON_TYPE_NUMBER:
        if (json->is_big_integer)
            return (jinja_value){.kind = JINJA_BIG_INT,
                                 .as.string = {json->as.num.digits, strlen(json->as.num.digits)}};
        return json->is_integer ? jinja_int(json->as.num.integer) : jinja_float(json->as.num.number);
    case JSON_TYPE_STRING: return jinja_string(json->as.string, json->length);
    case JSON_TYPE_ARRAY: {
        jinja_value list = jinja_new_list(ctx, JINJA_LIST, json->length);
        for (size_t i = 0; i < json->length; i++)
            jinja_list_push(ctx, list.as.list, jinja_from_json(ctx, &json->as.items[i], depth + 1));
        return list;
    }
    case JSON_TYPE_OBJECT: {
        jinja_value dict = jinja_new_dict(ctx, JINJA_DICT);
        for (size_t i = 0; i < json->length; i++) {
            const json_member *m = &json->as.members[i];
            jinja_dict_set(ctx, dict.as.dict, jinja_string(m->key, m->key_length),
                           jinja_from_json(ctx, &m->value, depth + 1));
        }
        return dict;
    }
    }
    return jinja_none();
}

/* ---- Python behaviour ------------------------------------------------------------------------------------- */

const char *jinja_type_name(jinja_value v) {
    switch (v.kind) {
    case JINJA_UNDEFINED: return "Undefined";
    case JINJA_NONE: return "NoneType";
    case JINJA_BOOL: return "bool";
    case JINJA_INT:
    case JINJA_BIG_INT: return "int";
    case JINJA_FLOAT: return "float";
    case JINJA_STRING: return "str";
    case JINJA_LIST: return "list";
    case JINJA_TUPLE: return "tuple";
    case JINJA_DICT: return "dict";
    case JINJA_NAMESPACE: return "Namespace";
    case JINJA_MACRO: return "Macro";
    case JINJA_LOOP: return "LoopContext";
    case JINJA_METHOD: return "builtin_function_or_method";
    case JINJA_FUNCTION: return "function";
    case JINJA_ITERATOR: return "generator";
    }
    return "object";
}

bool jinja_truthy(jinja_value v) {
    switch (v.kind) {
    case JINJA_UNDEFINED:
    case JINJA_NONE: return false;
    case JINJA_BOOL: return v.as.boolean;
    case JINJA_INT: return v.as.integer != 0;
    case JINJA_FLOAT: return v.as.number != 0.0;
    case JINJA_STRING: return v.as.string.length != 0;
    case JINJA_LIST:
    case JINJA_TUPLE: return v.as.list->count != 0;
    case JINJA_DICT: return v.as.dict->count != 0;
    default: return true;
    }
}

static bool is_number(jinja_value v) { return v.kind == JINJA_INT || v.kind == JINJA_BOOL || v.kind == JINJA_FLOAT; }
static double as_double(jinja_value v) {
    return v.kind == JINJA_FLOAT ? v.as.number : v.kind == JINJA_INT ? (double)v.as.integer : (double)v.as.boolean;
}
static int64_t as_int(jinja_value v) { return v.kind == JINJA_INT ? v.as.integer : (int64_t)v.as.boolean; }

/* Python compares an int with a float exactly; a double holds every int64 this interpreter meets closely enough
 * except past 2^53, where the exact comparison below matters. */
static int compare_numbers(jinja_value a, jinja_value b) {
    if (a.kind != JINJA_FLOAT && b.kind != JINJA_FLOAT) {
        int64_t x = as_int(a), y = as_int(b);
        return x < y ? -1 : x > y;
    }
    double x = as_double(a), y = as_double(b);
    if (a.kind != JINJA_FLOAT && fabs(y) < 9007199254740992.0 && y == floor(y)) {
        int64_t yi = (int64_t)y, xi = as_int(a);
        return xi < yi ? -1 : xi > yi;
    }
    if (b.kind != JINJA_FLOAT && fabs(x) < 9007199254740992.0 && x == floor(x)) {
        int64_t xi = (int64_t)x, yi = as_int(b);
        return xi < yi ? -1 : xi > yi;
    }
    return x < y ? -1 : x > y ? 1 : 0; /* NaN compares as neither */
}

static bool equal_at(jinja_render_context *ctx, jinja_value a, jinja_value b, int depth) {
    if (depth > JSON_MAX_DEPTH) jinja_runtime_error(ctx, "values nested too deeply to compare");
    if (is_number(a) && is_number(b)) {
        if (a.kind == JINJA_FLOAT || b.kind == JINJA_FLOAT) {
            double x = as_double(a), y = as_double(b);
            if (isnan(x) || isnan(y)) return false;
        }
        return compare_numbers(a, b) == 0;
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case JINJA_UNDEFINED:
    case JINJA_NONE: return true;
    case JINJA_STRING: return keys_equal(a, b);
    case JINJA_BIG_INT: /* equal integers are written alike in JSON (no leading zeros, no "+") */
        return a.as.string.length == b.as.string.length &&
               memcmp(a.as.string.data, b.as.string.data, a.as.string.length) == 0;
    case JINJA_LIST:
    case JINJA_TUPLE:
        if (a.as.list->count != b.as.list->count) return false;
        for (size_t i = 0; i < a.as.list->count; i++)
            if (!equal_at(ctx, a.as.list->items[i], b.as.list->items[i], depth + 1)) return false;
        return true;
    case JINJA_DICT:
        if (a.as.dict->count != b.as.dict->count) return false;
        for (size_t i = 0; i < a.as.dict->count; i++) {
            jinja_value *other = jinja_dict_get(b.as.dict, a.as.dict->keys[i]);
            if (!other || !equal_at(ctx, a.as.dict->values[i], *other, depth + 1)) return false;
        }
        return true;
    case JINJA_NAMESPACE: return a.as.dict == b.as.dict;
    case JINJA_MACRO: return a.as.macro == b.as.macro;
    case JINJA_LOOP: return a.as.loop == b.as.loop;
    case JINJA_METHOD:
        return strcmp(a.as.method->name, b.as.method->name) == 0 &&
               equal_at(ctx, a.as.method->self, b.as.method->self, depth + 1);
    case JINJA_FUNCTION: return a.as.function == b.as.function;
    case JINJA_ITERATOR: return a.as.iterator == b.as.iterator;
    default: return false;
    }
}

bool jinja_equal(jinja_render_context *ctx, jinja_value a, jinja_value b) { return equal_at(ctx, a, b, 0); }

void jinja_check_defined(jinja_render_context *ctx, jinja_value v) {
    if (v.kind == JINJA_UNDEFINED) jinja_runtime_error(ctx, "%s", v.as.string.data ? v.as.string.data : "undefined");
}

static int compare_at(jinja_render_context *ctx, jinja_value a, jinja_value b, int depth) {
    jinja_check_defined(ctx, a);
    jinja_check_defined(ctx, b);
    if (depth > JSON_MAX_DEPTH) jinja_runtime_error(ctx, "values nested too deeply to compare");
    if (is_number(a) && is_number(b)) return compare_numbers(a, b);
    if (a.kind == JINJA_STRING && b.kind == JINJA_STRING) {
        /* UTF-8 byte order is code point order, which is Python's. */
        size_t n = a.as.string.length < b.as.string.length ? a.as.string.length : b.as.string.length;
        int c = n ? memcmp(a.as.string.data, b.as.string.data, n) : 0;
        if (c) return c < 0 ? -1 : 1;
        return a.as.string.length < b.as.string.length ? -1 : a.as.string.length > b.as.string.length;
    }
    if (a.kind == b.kind && (a.kind == JINJA_LIST || a.kind == JINJA_TUPLE)) {
        const jinja_list *x = a.as.list, *y = b.as.list;
        for (size_t i = 0; i < x->count && i < y->count; i++) {
            if (equal_at(ctx, x->items[i], y->items[i], depth + 1)) continue;
            return compare_at(ctx, x->items[i], y->items[i], depth + 1);
        }
        return x->count < y->count ? -1 : x->count > y->count;
    }
    jinja_runtime_error(ctx, "'<' not supported between instances of '%s' and '%s'", jinja_type_name(a),
                        jinja_type_name(b));
}

int jinja_compare(jinja_render_context *ctx, jinja_value a, jinja_value b) { return compare_at(ctx, a, b, 0); }

/* repr(float): Python's shortest round-trip digits; inf and nan by name. */
static void write_float(text_builder *b, double v) {
    if (isnan(v))
        text_builder_puts(b, "nan");
    else if (isinf(v))
        text_builder_puts(b, v > 0 ? "inf" : "-inf");
    else
        python_json_float(b, v);
}

/* Python's str.isprintable() is false (repr escapes the character) for the categories Cc, Cf, Cs, Co, Cn,
 * Zl, Zp and Zs other than the space; utf8proc's Unicode tables stand in for Python's. */
static bool is_unprintable(uint32_t c) {
    if (c == ' ') return false;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return true;
    default: return false;
    }
}

static void write_string_repr(text_builder *b, const char *s, size_t n) {
    bool has_single = memchr(s, '\'', n) != NULL, has_double = memchr(s, '"', n) != NULL;
    char quote = has_single && !has_double ? '"' : '\'';
    text_builder_putc(b, quote);
    for (size_t at = 0; at < n;) {
        size_t start = at;
        uint32_t c = jinja_utf8_next(s, n, &at);
        if (c == (uint32_t)quote || c == '\\') {
            text_builder_putc(b, '\\');
            text_builder_putc(b, (char)c);
        } else if (c == '\n') {
            text_builder_puts(b, "\\n");
        } else if (c == '\r') {
            text_builder_puts(b, "\\r");
        } else if (c == '\t') {
            text_builder_puts(b, "\\t");
        } else if (is_unprintable(c)) {
            if (c < 0x100)
                text_builder_printf(b, "\\x%02x", c);
            else if (c < 0x10000)
                text_builder_printf(b, "\\u%04x", c);
            else
                text_builder_printf(b, "\\U%08x", c);
        } else {
            text_builder_append(b, s + start, at - start);
        }
    }
    text_builder_putc(b, quote);
}

void jinja_write_repr(jinja_render_context *ctx, text_builder *b, jinja_value v, int depth) {
    if (depth > JSON_MAX_DEPTH) jinja_runtime_error(ctx, "a value nested too deeply to print");
    jinja_count_steps(ctx, 1);
    switch (v.kind) {
    case JINJA_UNDEFINED: text_builder_puts(b, "Undefined"); return; /* repr(Undefined()) */
    case JINJA_STRING:
        if (v.markup) text_builder_puts(b, "Markup(");
        write_string_repr(b, v.as.string.data, v.as.string.length);
        if (v.markup) text_builder_putc(b, ')');
        return;
    case JINJA_LIST:
    case JINJA_TUPLE: {
        const jinja_list *list = v.as.list;
        text_builder_putc(b, v.kind == JINJA_LIST ? '[' : '(');
        for (size_t i = 0; i < list->count; i++) {
            if (i) text_builder_puts(b, ", ");
            jinja_write_repr(ctx, b, list->items[i], depth + 1);
        }
        if (v.kind == JINJA_TUPLE && list->count == 1) text_builder_putc(b, ',');
        text_builder_putc(b, v.kind == JINJA_LIST ? ']' : ')');
        return;
    }
    case JINJA_DICT:
    case JINJA_NAMESPACE: {
        const jinja_dict *dict = v.as.dict;
        text_builder_puts(b, v.kind == JINJA_DICT ? "{" : "<Namespace {");
        for (size_t i = 0; i < dict->count; i++) {
            if (i) text_builder_puts(b, ", ");
            jinja_write_repr(ctx, b, dict->keys[i], depth + 1);
            text_builder_puts(b, ": ");
            jinja_write_repr(ctx, b, dict->values[i], depth + 1);
        }
        text_builder_puts(b, v.kind == JINJA_DICT ? "}" : "}>");
        return;
    }
    default: jinja_write_str(ctx, b, v); return;
    }
}

void jinja_write_str(jinja_render_context *ctx, text_builder *b, jinja_value v) {
    switch (v.kind) {
    case JINJA_UNDEFINED: return;
    case JINJA_NONE: text_builder_puts(b, "None"); return;
    case JINJA_BOOL: text_builder_puts(b, v.as.boolean ? "True" : "False"); return;
    case JINJA_INT: python_json_int(b, v.as.integer); return;
    case JINJA_BIG_INT: text_builder_append(b, v.as.string.data, v.as.string.length); return;
    case JINJA_FLOAT: write_float(b, v.as.number); return;
    case JINJA_STRING: text_builder_append(b, v.as.string.data, v.as.string.length); return;
    case JINJA_LIST:
    case JINJA_TUPLE:
    case JINJA_DICT:
    case JINJA_NAMESPACE: jinja_write_repr(ctx, b, v, 0); return;
    case JINJA_MACRO:
        if (v.as.macro->node->kind == JINJA_NODE_MACRO)
            text_builder_printf(b, "<Macro '%s'>", v.as.macro->node->name);
        else
            text_builder_puts(b, "<Macro 'caller'>");
        return;
    case JINJA_LOOP:
    case JINJA_METHOD:
    case JINJA_FUNCTION:
    case JINJA_ITERATOR:
        /* Python prints these with a memory address, which no template can rely on. */
        jinja_runtime_error(ctx, "cannot print a %s (Python shows its address)", jinja_type_name(v));
    }
}

jinja_value jinja_to_str(jinja_render_context *ctx, jinja_value v) {
    if (v.kind == JINJA_STRING) return v;
    text_builder b = {0};
    jinja_write_str(ctx, &b, v);
    if (b.failed) {
        text_builder_free(&b);
        jinja_runtime_error(ctx, "out of memory");
    }
    jinja_value s = jinja_string_copy(ctx, b.data ? b.data : "", b.length);
    text_builder_free(&b);
    return s;
}

jinja_list *jinja_iterate(jinja_render_context *ctx, jinja_value v) {
    switch (v.kind) {
    case JINJA_UNDEFINED: return jinja_new_list(ctx, JINJA_LIST, 0).as.list;
    case JINJA_LIST:
    case JINJA_TUPLE: return v.as.list;
    case JINJA_ITERATOR: {
        jinja_iterator *it = v.as.iterator;
        jinja_list *rest = jinja_new_list(ctx, JINJA_LIST, it->items->count - it->position).as.list;
        for (; it->position < it->items->count; it->position++) jinja_list_push(ctx, rest, it->items->items[it->position]);
        return rest;
    }
    case JINJA_DICT: {
        jinja_list *keys = jinja_new_list(ctx, JINJA_LIST, v.as.dict->count).as.list;
        for (size_t i = 0; i < v.as.dict->count; i++) jinja_list_push(ctx, keys, v.as.dict->keys[i]);
        return keys;
    }
    case JINJA_STRING: {
        const char *s = v.as.string.data;
        size_t n = v.as.string.length;
        jinja_list *chars = jinja_new_list(ctx, JINJA_LIST, jinja_utf8_count(s, n)).as.list;
        for (size_t at = 0; at < n;) {
            size_t start = at;
            jinja_utf8_next(s, n, &at);
            jinja_list_push(ctx, chars, jinja_string(s + start, at - start));
        }
        return chars;
    }
    default: jinja_runtime_error(ctx, "'%s' object is not iterable", jinja_type_name(v));
    }
}

size_t jinja_length(jinja_render_context *ctx, jinja_value v) {
    switch (v.kind) {
    case JINJA_UNDEFINED: return 0;
    case JINJA_STRING: return jinja_utf8_count(v.as.string.data, v.as.string.length);
    case JINJA_LIST:
    case JINJA_TUPLE: return v.as.list->count;
    case JINJA_DICT: return v.as.dict->count;
    default: jinja_runtime_error(ctx, "object of type '%s' has no len()", jinja_type_name(v));
    }
}

/* ---- json.dumps --------------------------------------------------------------------------------------------- */

static void json_newline(text_builder *b, const char *indent, int depth) {
    text_builder_putc(b, '\n');
    for (int i = 0; i < depth; i++) text_builder_puts(b, indent);
}

/* A dict key as json.dumps writes it: strings as they are; numbers, booleans and None converted. */
static void write_json_key(jinja_render_context *ctx, text_builder *b, jinja_value key) {
    switch (key.kind) {
    case JINJA_STRING: python_json_string(b, key.as.string.data, key.as.string.length); return;
    case JINJA_INT: text_builder_printf(b, "\"%lld\"", (long long)key.as.integer); return;
    case JINJA_BOOL: text_builder_puts(b, key.as.boolean ? "\"true\"" : "\"false\""); return;
    case JINJA_NONE: text_builder_puts(b, "\"null\""); return;
    case JINJA_FLOAT: {
        text_builder_putc(b, '"');
        python_json_float(b, key.as.number);
        text_builder_putc(b, '"');
        return;
    }
    default: jinja_runtime_error(ctx, "keys must be str, int, float, bool or None, not %s", jinja_type_name(key));
    }
}

void jinja_write_json(jinja_render_context *ctx, text_builder *b, jinja_value v, const char *indent, const char *item_sep,
                      const char *key_sep, bool sort_keys, int depth) {
    if (depth > JSON_MAX_DEPTH) jinja_runtime_error(ctx, "a value nested too deeply for tojson");
    jinja_count_steps(ctx, 1);
    switch (v.kind) {
    case JINJA_NONE: text_builder_puts(b, "null"); return;
    case JINJA_BOOL: text_builder_puts(b, v.as.boolean ? "true" : "false"); return;
    case JINJA_INT: python_json_int(b, v.as.integer); return;
    case JINJA_BIG_INT: text_builder_append(b, v.as.string.data, v.as.string.length); return;
    case JINJA_FLOAT: python_json_float(b, v.as.number); return;
    case JINJA_STRING: python_json_string(b, v.as.string.data, v.as.string.length); return;
    case JINJA_LIST:
    case JINJA_TUPLE: {
        const jinja_list *list = v.as.list;
        if (list->count == 0) {
            text_builder_puts(b, "[]");
            return;
        }
        text_builder_putc(b, '[');
        for (size_t i = 0; i < list->count; i++) {
            if (i) text_builder_puts(b, item_sep);
            if (indent) json_newline(b, indent, depth + 1);
            jinja_write_json(ctx, b, list->items[i], indent, item_sep, key_sep, sort_keys, depth + 1);
        }
        if (indent) json_newline(b, indent, depth);
        text_builder_putc(b, ']');
        return;
    }
    case JINJA_DICT: {
        const jinja_dict *dict = v.as.dict;
        if (dict->count == 0) {
            text_builder_puts(b, "{}");
            return;
        }
        size_t *order = jinja_arena_alloc(&ctx->arena, dict->count * sizeof *order);
        for (size_t i = 0; i < dict->count; i++) order[i] = i;
        if (sort_keys) {
            /* Stable insertion sort, as sorted(dct.items()) compares keys (mixed types are a TypeError). */
            for (size_t i = 1; i < dict->count; i++) {
                size_t k = order[i], j = i;
                while (j > 0 && jinja_compare(ctx, dict->keys[order[j - 1]], dict->keys[k]) > 0) {
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = k;
                jinja_count_steps(ctx, i);
            }
        }
        text_builder_putc(b, '{');
        for (size_t n = 0; n < dict->count; n++) {
            size_t i = order[n];
            if (n) text_builder_puts(b, item_sep);
            if (indent) json_newline(b, indent, depth + 1);
            write_json_key(ctx, b, dict->keys[i]);
            text_builder_puts(b, key_sep);
            jinja_write_json(ctx, b, dict->values[i], indent, item_sep, key_sep, sort_keys, depth + 1);
        }
        if (indent) json_newline(b, indent, depth);
        text_builder_putc(b, '}');
        return;
    }
    default:
        jinja_runtime_error(ctx, "Object of type %s is not JSON serializable", jinja_type_name(v));
    }
}

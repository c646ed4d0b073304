/* The Jinja interpreter's inside: arena, tokens, syntax tree, values, and the functions the lexer (jinja_lex.c),
 * parser (jinja_parse.c), values (jinja_value.c), evaluator (jinja_eval.c) and builtins (jinja_builtins.c)
 * share. Nothing here is public; src/chat/jinja.h is the contract.
 *
 * Errors unwind with longjmp: a failing step records its message through kite_fail() and jumps back to
 * jinja_parse / jinja_render, which return the status. That is safe because everything a parse or a render
 * allocates lives in one arena that the entry point frees (or keeps, for a parsed template) as a whole, so an
 * unwind leaks nothing; the only other allocation, the render's output builder, belongs to jinja_render.
 */
#ifndef KITE_CHAT_JINJA_INTERNAL_H
#define KITE_CHAT_JINJA_INTERNAL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chat/jinja.h"
#include "util/text_builder.h"

/* ---- arena ------------------------------------------------------------------------------------------------ */

typedef struct jinja_arena_chunk jinja_arena_chunk;

typedef struct jinja_arena {
    jinja_arena_chunk *chunks;
    size_t used;        /* bytes handed out, all chunks */
    size_t limit;       /* the most bytes it may hand out */
    jmp_buf *on_fail;   /* where a failure jumps, after kite_fail() */
    kite_status status; /* the failure's status, set before the jump */
} jinja_arena;

/* Zeroed memory, 16-byte aligned; on out of memory or past `limit` it records the error and jumps. */
void *jinja_arena_alloc(jinja_arena *arena, size_t size);
/* Copies of text, NUL-terminated. */
char *jinja_arena_strndup(jinja_arena *arena, const char *text, size_t length);
void jinja_arena_free(jinja_arena *arena);

/* ---- tokens (jinja_lex.c) ------------------------------------------------------------------------------------ */

typedef enum jinja_token_kind {
    JINJA_TOKEN_TEXT,        /* template text, whitespace control already applied */
    JINJA_TOKEN_VAR_BEGIN,   /* {{ */
    JINJA_TOKEN_VAR_END,     /* }} */
    JINJA_TOKEN_BLOCK_BEGIN, /* {% */
    JINJA_TOKEN_BLOCK_END,   /* %} */
    JINJA_TOKEN_NAME,
    JINJA_TOKEN_STRING,      /* text holds the decoded value */
    JINJA_TOKEN_INT,
    JINJA_TOKEN_FLOAT,
    JINJA_TOKEN_OPERATOR,    /* text holds it: "+", "//", "==", "(", ... */
    JINJA_TOKEN_EOF,
} jinja_token_kind;

typedef struct jinja_token {
    jinja_token_kind kind;
    int line;
    const char *text; /* NUL-terminated (arena); for TEXT/STRING/NAME/OPERATOR */
    size_t length;
    int64_t integer;  /* INT */
    double number;    /* FLOAT */
} jinja_token;

typedef struct jinja_token_list {
    jinja_token *tokens;
    size_t count;
} jinja_token_list;

/* Tokenizes source with transformers' settings (trim_blocks, lstrip_blocks, keep_trailing_newline off).
 * Errors jump through the arena's on_fail with KITE_ERROR_INVALID_TEMPLATE. */
void jinja_lex(jinja_arena *arena, const char *source, size_t length, const char *name, jinja_token_list *out);

/* Python's str.isspace() for one code point (also what the re module's \s matches). */
bool jinja_is_python_space(uint32_t code_point);
/* Decodes one UTF-8 code point at text[*at] (invalid bytes come back one at a time as themselves). */
uint32_t jinja_utf8_next(const char *text, size_t length, size_t *at);
/* Encodes one code point; returns the bytes written (at most 4). */
size_t jinja_utf8_put(char *out, uint32_t code_point);

/* ---- values (jinja_value.c) ----------------------------------------------------------------------------------- */

typedef enum jinja_kind {
    JINJA_UNDEFINED,
    JINJA_NONE,
    JINJA_BOOL,
    JINJA_INT,
    JINJA_FLOAT,
    JINJA_STRING,
    JINJA_LIST,
    JINJA_TUPLE,
    JINJA_DICT,
    JINJA_NAMESPACE,
    JINJA_MACRO,
    JINJA_LOOP,
    JINJA_METHOD,   /* a method of a value, bound to it: "abc".split */
    JINJA_FUNCTION, /* a global function: range, namespace, raise_exception, ... */
    JINJA_ITERATOR, /* what map/select/reject/unique/batch/items/reverse return: a Python generator, iterable once,
                     * always true, without len() */
    JINJA_BIG_INT,  /* an integer beyond int64 from the variables' JSON (a tool call's argument, say): Python keeps
                     * every digit, so it prints and goes through tojson as written (as.string holds the digits);
                     * arithmetic and ordering on it are refused, as kite's integers are 64-bit */
} jinja_kind;

typedef struct jinja_list jinja_list;
typedef struct jinja_dict jinja_dict;
typedef struct jinja_macro jinja_macro;
typedef struct jinja_loop jinja_loop;
typedef struct jinja_method jinja_method;
typedef struct jinja_iterator jinja_iterator;

typedef struct jinja_value {
    jinja_kind kind;
    /* STRING: markupsafe's Markup (what safe and escape return): escape leaves it as it is, `+` escapes the other
     * operand, repr() shows Markup('...'). Other filters and methods give plain strings. */
    bool markup;
    union {
        bool boolean;
        int64_t integer;
        double number;
        struct {
            const char *data; /* UTF-8 bytes; not necessarily NUL-terminated */
            size_t length;    /* bytes */
        } string;             /* STRING; BIG_INT: its digits; UNDEFINED: the message an error about it gives */
        jinja_list *list;     /* LIST, TUPLE */
        jinja_dict *dict;     /* DICT, NAMESPACE */
        jinja_macro *macro;
        jinja_loop *loop;
        jinja_method *method;
        int function;         /* JINJA_FUNCTION: a jinja_function */
        jinja_iterator *iterator;
    } as;
} jinja_value;

struct jinja_list {
    jinja_value *items;
    size_t count, capacity;
};

/* Insertion-ordered, looked up linearly: the dicts templates see are small (a message, a tool's schema). */
struct jinja_dict {
    jinja_value *keys;
    jinja_value *values;
    size_t count, capacity;
};

struct jinja_iterator {
    jinja_list *items; /* computed when it is made (jinja2 computes them as they are consumed) */
    size_t position;   /* items before it are consumed */
};

struct jinja_method {
    jinja_value self;
    const char *name;
};

typedef enum jinja_function {
    JINJA_FUNCTION_RAISE_EXCEPTION,
    JINJA_FUNCTION_STRFTIME_NOW,
    JINJA_FUNCTION_NAMESPACE,
    JINJA_FUNCTION_RANGE,
    JINJA_FUNCTION_DICT,
} jinja_function;

/* ---- syntax tree (jinja_parse.c) ---------------------------------------------------------------------------- */

typedef enum jinja_node_kind {
    /* statements */
    JINJA_NODE_TEXT,         /* literal: the text */
    JINJA_NODE_OUTPUT,       /* a: the expression */
    JINJA_NODE_IF,           /* a: test; body: then; else_body: else (an elif is an IF alone in else_body) */
    JINJA_NODE_FOR,          /* target: names; a: iterable; b: filter or NULL; body; else_body */
    JINJA_NODE_SET,          /* target: NAME, GETATTR (namespace) or TUPLE of names; a: value */
    JINJA_NODE_SET_BLOCK,    /* target; body; filters: FILTER nodes applied to the captured text (a is NULL) */
    JINJA_NODE_MACRO,        /* name; params (names) with defaults (a node or NULL each); body */
    JINJA_NODE_CALL_BLOCK,   /* a: the CALL; params/defaults: the caller's; body: the caller's */
    JINJA_NODE_FILTER_BLOCK, /* filters: FILTER nodes applied to the body's text; body */
    JINJA_NODE_BREAK,
    JINJA_NODE_CONTINUE,
    /* expressions */
    JINJA_NODE_LITERAL,      /* literal */
    JINJA_NODE_NAME,         /* name */
    JINJA_NODE_LIST,         /* items */
    JINJA_NODE_TUPLE,        /* items */
    JINJA_NODE_DICT,         /* items: keys; values */
    JINJA_NODE_GETATTR,      /* a.name */
    JINJA_NODE_GETITEM,      /* a[b] */
    JINJA_NODE_SLICE,        /* a[b:c:d], each of b, c, d may be NULL */
    JINJA_NODE_CALL,         /* a(items..., kwarg_names[i]=values[i]...) */
    JINJA_NODE_FILTER,       /* a | op(items..., kwargs); a is NULL inside a filter block's chain */
    JINJA_NODE_TEST,         /* a is [not] op(items...); negated */
    JINJA_NODE_NEGATE,       /* -a */
    JINJA_NODE_PLUS,         /* +a */
    JINJA_NODE_NOT,          /* not a */
    JINJA_NODE_BINARY,       /* a op b: op is a jinja_binary_op */
    JINJA_NODE_AND,          /* a and b */
    JINJA_NODE_OR,           /* a or b */
    JINJA_NODE_COMPARE,      /* a then (compare_ops[i], items[i]) ..., chained as Python */
    JINJA_NODE_CONDITIONAL,  /* b if a else c (c may be NULL: undefined) */
    JINJA_NODE_CONCAT,       /* items joined with ~ */
} jinja_node_kind;

typedef enum jinja_binary_op {
    JINJA_OP_ADD,
    JINJA_OP_SUBTRACT,
    JINJA_OP_MULTIPLY,
    JINJA_OP_DIVIDE,
    JINJA_OP_FLOOR_DIVIDE,
    JINJA_OP_MODULO,
    JINJA_OP_POWER,
} jinja_binary_op;

typedef enum jinja_compare_op {
    JINJA_COMPARE_EQ,
    JINJA_COMPARE_NE,
    JINJA_COMPARE_LT,
    JINJA_COMPARE_LE,
    JINJA_COMPARE_GT,
    JINJA_COMPARE_GE,
    JINJA_COMPARE_IN,
    JINJA_COMPARE_NOT_IN,
} jinja_compare_op;

typedef struct jinja_node jinja_node;

typedef struct jinja_node_list {
    jinja_node **items;
    size_t count;
} jinja_node_list;

struct jinja_node {
    jinja_node_kind kind;
    int line;
    int op;        /* BINARY: jinja_binary_op; FILTER: jinja_filter; TEST: jinja_test */
    bool negated;  /* TEST: `is not` */
    const char *name; /* NAME, GETATTR, MACRO; FILTER/TEST: as written */
    jinja_value literal;   /* LITERAL, TEXT */
    jinja_node *a, *b, *c, *d;
    jinja_node *target;    /* FOR, SET, SET_BLOCK */
    jinja_node_list items; /* see the kinds */
    jinja_node_list values;        /* DICT values; CALL/FILTER keyword values */
    const char **kwarg_names;      /* CALL/FILTER: values.count of them */
    int *compare_ops;              /* COMPARE: items.count of them */
    jinja_node_list body, else_body;
    jinja_node_list filters;       /* SET_BLOCK, FILTER_BLOCK */
    const char **params;           /* MACRO, CALL_BLOCK */
    jinja_node **defaults;
    size_t n_params;
    bool uses_varargs, uses_kwargs, uses_caller; /* MACRO: whether its body names them, as jinja2 decides */
};

struct jinja_template {
    jinja_arena arena; /* the tree and its strings */
    char *name;
    jinja_node_list body;
};

/* ---- builtins (jinja_builtins.c) ---------------------------------------------------------------------------- */

/* Filters and tests are resolved while parsing: an unknown or unsupported name is refused there. */
int jinja_filter_lookup(const char *name);  /* a jinja_filter index, or -1 */
int jinja_test_lookup(const char *name);    /* a jinja_test index, or -1 */
/* Whether jinja2 itself has a filter / test of that name (to say "not supported" rather than "unknown"). */
bool jinja_filter_is_jinja2(const char *name);
bool jinja_test_is_jinja2(const char *name);

/* ---- rendering (jinja_eval.c) --------------------------------------------------------------------------------- */

typedef struct jinja_frame jinja_frame;

struct jinja_macro {
    const jinja_node *node;     /* MACRO, or CALL_BLOCK for a caller */
    jinja_frame *closure;       /* the scope it was defined in */
};

struct jinja_loop {
    const jinja_list *items;
    size_t index0;
};

typedef struct jinja_render_context {
    jinja_arena arena;
    const jinja_template *template_;
    jmp_buf on_fail;
    kite_status status;
    text_builder *out;          /* where text goes now: the result, or a capture (macro call, block set) */
    jinja_dict *globals;        /* the render's variables and the global functions */
    jinja_frame *frame;         /* the innermost scope */
    uint64_t steps;
    int macro_depth;
    int line;                   /* of the node being evaluated, for messages */
    jinja_value pending_caller; /* a call block's caller, for the macro call it makes (else undefined) */
    text_builder *result;       /* the render's output */
    text_builder captures[64];  /* output captured by macro calls, block sets and tojson, innermost last */
    int n_captures;
} jinja_render_context;

/* A fresh capture builder on top of the list (freed by the unwind if an error comes first). Only the innermost
 * builder grows, so each one's limit is what the output limit leaves after the result and the outer captures:
 * all the text being built at once stays within JINJA_MAX_OUTPUT_BYTES. */
text_builder *jinja_capture_push(jinja_render_context *ctx);
/* The innermost capture's text copied into the arena, the builder freed and popped. */
jinja_value jinja_capture_pop(jinja_render_context *ctx);

/* Records "NAME:LINE: message" (KITE_ERROR_INVALID_INPUT) and unwinds the render. */
_Noreturn void jinja_runtime_error(jinja_render_context *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Counts `n` units of work against the render's bound. */
void jinja_count_steps(jinja_render_context *ctx, uint64_t n);

jinja_value jinja_call_value(jinja_render_context *ctx, jinja_value callee, const jinja_value *args, size_t n_args,
                             const char **kwarg_names, const jinja_value *kwargs, size_t n_kwargs);

/* ---- values (jinja_value.c) ----------------------------------------------------------------------------------- */

jinja_value jinja_undefined(const char *message);
jinja_value jinja_none(void);
jinja_value jinja_bool(bool value);
jinja_value jinja_int(int64_t value);
jinja_value jinja_float(double value);
jinja_value jinja_string(const char *data, size_t length); /* does not copy */
jinja_value jinja_string_copy(jinja_render_context *ctx, const char *data, size_t length);
jinja_value jinja_cstring(const char *text); /* a static or arena string */
jinja_value jinja_new_list(jinja_render_context *ctx, jinja_kind kind, size_t capacity);
jinja_value jinja_new_dict(jinja_render_context *ctx, jinja_kind kind);
jinja_value jinja_new_iterator(jinja_render_context *ctx, jinja_list *items);
void jinja_list_push(jinja_render_context *ctx, jinja_list *list, jinja_value item);
void jinja_dict_set(jinja_render_context *ctx, jinja_dict *dict, jinja_value key, jinja_value value);
/* Python's TypeError for a dict key or set member that cannot be hashed (list, dict, ...; undefined fails as
 * undefined). Tuples of nested values are checked item by item. */
void jinja_check_hashable(jinja_render_context *ctx, jinja_value value);
/* NULL when absent. */
jinja_value *jinja_dict_get(jinja_dict *dict, jinja_value key);
jinja_value *jinja_dict_get_string(jinja_dict *dict, const char *key);
/* The render's view of a JSON value (copied into the arena). */
jinja_value jinja_from_json(jinja_render_context *ctx, const json_value *json, int depth);

const char *jinja_type_name(jinja_value value); /* Python's: 'str', 'int', 'list', 'dict', 'NoneType', ... */
bool jinja_truthy(jinja_value value);
bool jinja_equal(jinja_render_context *ctx, jinja_value a, jinja_value b);
/* -1, 0, 1 as Python orders them; a TypeError (strings against numbers, ...) is a runtime error. */
int jinja_compare(jinja_render_context *ctx, jinja_value a, jinja_value b);
/* str(value) appended: strings as they are, the rest as Python prints them; undefined prints nothing. */
void jinja_write_str(jinja_render_context *ctx, text_builder *b, jinja_value value);
/* repr(value) appended. */
void jinja_write_repr(jinja_render_context *ctx, text_builder *b, jinja_value value, int depth);
/* str(value) as a string value (strings come back as they are). */
jinja_value jinja_to_str(jinja_render_context *ctx, jinja_value value);
/* Undefined: its error. Used where jinja2's Undefined raises on use. */
void jinja_check_defined(jinja_render_context *ctx, jinja_value value);
/* The items iterating it yields, as Python: a list/tuple's items, a dict's keys, a string's characters,
 * nothing for undefined, an iterator's items once (then nothing); anything else is a runtime error. */
jinja_list *jinja_iterate(jinja_render_context *ctx, jinja_value value);
/* len(); a runtime error for values without one. */
size_t jinja_length(jinja_render_context *ctx, jinja_value value);
/* Code points of a UTF-8 string. */
size_t jinja_utf8_count(const char *text, size_t length);

/* json.dumps(value, ensure_ascii=False, indent=indent, separators=..., sort_keys=...) appended; `indent` is the
 * text of one level (NULL: indent=None, everything on one line). */
void jinja_write_json(jinja_render_context *ctx, text_builder *b, jinja_value value, const char *indent,
                      const char *item_separator, const char *key_separator, bool sort_keys, int depth);

/* ---- builtins (jinja_builtins.c) ----------------------------------------------------------------------------- */

jinja_value jinja_apply_filter(jinja_render_context *ctx, int filter, jinja_value input, const jinja_value *args,
                               size_t n_args, const char **kwarg_names, const jinja_value *kwargs, size_t n_kwargs);
bool jinja_apply_test(jinja_render_context *ctx, int test, jinja_value input, const jinja_value *args, size_t n_args);
/* obj.name as jinja2's sandboxed getattr: a method of a str/dict/list (bound), a dict's key, or undefined. */
jinja_value jinja_get_attribute(jinja_render_context *ctx, jinja_value object, const char *name);
/* obj[key] as jinja2's getitem: an item, else an attribute, else undefined. */
jinja_value jinja_get_item(jinja_render_context *ctx, jinja_value object, jinja_value key);
/* markupsafe.escape of a string: & < > ' " as entities, as a Markup string. */
jinja_value jinja_html_escape(jinja_render_context *ctx, jinja_value text);
jinja_value jinja_call_method(jinja_render_context *ctx, const jinja_method *method, const jinja_value *args,
                              size_t n_args, const char **kwarg_names, const jinja_value *kwargs, size_t n_kwargs);
jinja_value jinja_call_function(jinja_render_context *ctx, int function, const jinja_value *args, size_t n_args,
                                const char **kwarg_names, const jinja_value *kwargs, size_t n_kwargs);

/* Bounds that keep any template finite. */
#define JINJA_MAX_OUTPUT_BYTES ((size_t)64 << 20)
#define JINJA_MAX_ARENA_BYTES ((size_t)256 << 20)
#define JINJA_MAX_STEPS ((uint64_t)20000000)
#define JINJA_MAX_MACRO_DEPTH 48
#define JINJA_MAX_NESTING 128 /* parser recursion: nested expressions and blocks */
#define JINJA_MAX_RANGE 100000 /* as jinja2's sandbox (MAX_RANGE) */

#endif

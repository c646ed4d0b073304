/* Statements and expressions into a syntax tree, following jinja2's parser (jinja2/parser.py) rule for rule, so
 * precedence and the odd corners come out the same:
 *   conditional (`a if c else b`) < or < and < not < comparisons (chained, `in`, `not in`) < + - < ~ < * / // %
 *   < ** < unary - + < primary with postfix (.name, [index], [a:b:c], (call)) and then filters `|f` and tests
 *   `is [not] t`.
 * Statements: if/elif/else, for (tuple targets, inline `if` filter, else), set (names, namespace attributes,
 * tuples, block set with filters), macro (defaults, varargs/kwargs/caller as jinja2 detects them), call blocks,
 * filter blocks, break/continue (loopcontrols). Refused with KITE_ERROR_INVALID_TEMPLATE naming the line:
 * include/import/from/extends/block (no loader), with, autoescape, do, trans, recursive loops, `*args` and
 * `**kwargs` in calls, unknown or unsupported filters and tests.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja_internal.h"
#include "util/error.h"

typedef struct parser {
    jinja_arena *arena;
    const char *name;
    const jinja_token *tokens;
    size_t count, pos;
    int depth;
    int loop_depth;
    jinja_node *macro; /* the macro whose body is being parsed */
} parser;

static _Noreturn void parse_fail(parser *p, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static _Noreturn void parse_fail(parser *p, int line, const char *fmt, ...) {
    char message[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    p->arena->status = kite_fail(KITE_ERROR_INVALID_TEMPLATE, "%s:%d: %s", p->name, line, message);
    longjmp(*p->arena->on_fail, 1);
}

static const jinja_token *current(const parser *p) { return &p->tokens[p->pos]; }
static const jinja_token *look(const parser *p) {
    return p->pos + 1 < p->count ? &p->tokens[p->pos + 1] : &p->tokens[p->count - 1];
}
static const jinja_token *advance(parser *p) {
    const jinja_token *t = &p->tokens[p->pos];
    if (p->pos + 1 < p->count) p->pos++;
    return t;
}

static bool is_op(const jinja_token *t, const char *op) {
    return t->kind == JINJA_TOKEN_OPERATOR && strcmp(t->text, op) == 0;
}
static bool is_name(const jinja_token *t, const char *name) {
    return t->kind == JINJA_TOKEN_NAME && strcmp(t->text, name) == 0;
}

/* How jinja2 names a token in "expected ..." messages. */
static const char *describe(const jinja_token *t) {
    switch (t->kind) {
    case JINJA_TOKEN_TEXT: return "template data";
    case JINJA_TOKEN_VAR_BEGIN: return "begin of print statement";
    case JINJA_TOKEN_VAR_END: return "end of print statement";
    case JINJA_TOKEN_BLOCK_BEGIN: return "begin of statement block";
    case JINJA_TOKEN_BLOCK_END: return "end of statement block";
    case JINJA_TOKEN_STRING: return "string";
    case JINJA_TOKEN_INT: return "integer";
    case JINJA_TOKEN_FLOAT: return "float";
    case JINJA_TOKEN_EOF: return "end of template";
    default: return t->text;
    }
}

static void expect_op(parser *p, const char *op) {
    if (!is_op(current(p), op))
        parse_fail(p, current(p)->line, "expected token '%s', got '%s'", op, describe(current(p)));
    advance(p);
}

static const char *expect_name(parser *p) {
    if (current(p)->kind != JINJA_TOKEN_NAME)
        parse_fail(p, current(p)->line, "expected token 'name', got '%s'", describe(current(p)));
    return advance(p)->text;
}

static void expect_block_end(parser *p) {
    if (current(p)->kind != JINJA_TOKEN_BLOCK_END)
        parse_fail(p, current(p)->line, "expected token 'end of statement block', got '%s'", describe(current(p)));
    advance(p);
}

static jinja_node *new_node(parser *p, jinja_node_kind kind, int line) {
    jinja_node *n = jinja_arena_alloc(p->arena, sizeof *n);
    n->kind = kind;
    n->line = line;
    return n;
}

/* A growable node list while parsing; the arena keeps what is abandoned on growth. */
static void list_push(parser *p, jinja_node_list *list, size_t *capacity, jinja_node *node) {
    if (list->count == *capacity) {
        size_t grown = *capacity ? *capacity * 2 : 4;
        jinja_node **items = jinja_arena_alloc(p->arena, grown * sizeof *items);
        if (list->count) memcpy(items, list->items, list->count * sizeof *items);
        list->items = items;
        *capacity = grown;
    }
    list->items[list->count++] = node;
}

static void enter(parser *p) {
    if (++p->depth > JINJA_MAX_NESTING) parse_fail(p, current(p)->line, "the template nests too deeply");
}
static void leave(parser *p) { p->depth--; }

/* A left-deep chain (a + b + c, x|f|g, a.b.c) is as deep a tree as nesting is: each link counts until the
 * expression ends, so evaluating any tree stays within JINJA_MAX_NESTING levels of recursion. */
static void enter_link(parser *p, int *links) {
    enter(p);
    (*links)++;
}
static void leave_links(parser *p, int links) { p->depth -= links; }

static jinja_node *parse_expression(parser *p, bool with_condexpr);
static jinja_node *parse_unary(parser *p, bool with_filter);
static jinja_node *parse_primary(parser *p);
static jinja_node *parse_postfix(parser *p, jinja_node *node);
static jinja_node *parse_filter_expr(parser *p, jinja_node *node);

/* Tuple ends: the tag's end, `)`, or a name the statement reserves (`in` of for, `recursive`). */
static bool is_tuple_end(const parser *p, const char *extra_end) {
    const jinja_token *t = current(p);
    if (t->kind == JINJA_TOKEN_VAR_END || t->kind == JINJA_TOKEN_BLOCK_END || is_op(t, ")")) return true;
    return extra_end && is_name(t, extra_end);
}

/* jinja2's parse_tuple: `a`, `a, b`, `a,` (a tuple); `simplified` takes primaries only (assignment targets). */
static jinja_node *parse_tuple(parser *p, bool simplified, bool with_condexpr, const char *extra_end,
                               bool explicit_parentheses) {
    const int line = current(p)->line;
    jinja_node_list items = {0};
    size_t capacity = 0;
    bool is_tuple = false;
    for (;;) {
        if (items.count) expect_op(p, ",");
        if (is_tuple_end(p, extra_end)) break;
        jinja_node *item = simplified ? parse_primary(p) : parse_expression(p, with_condexpr);
        list_push(p, &items, &capacity, item);
        if (is_op(current(p), ","))
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (items.count) return items.items[0];
        if (!explicit_parentheses)
            parse_fail(p, current(p)->line, "Expected an expression, got '%s'", describe(current(p)));
    }
    jinja_node *tuple = new_node(p, JINJA_NODE_TUPLE, line);
    tuple->items = items;
    return tuple;
}

static jinja_node *parse_condexpr(parser *p);
static jinja_node *parse_or(parser *p);

static jinja_node *parse_expression(parser *p, bool with_condexpr) {
    enter(p);
    jinja_node *n = with_condexpr ? parse_condexpr(p) : parse_or(p);
    leave(p);
    return n;
}

static jinja_node *parse_condexpr(parser *p) {
    const int line = current(p)->line;
    jinja_node *expr = parse_or(p);
    int links = 0;
    while (is_name(current(p), "if")) {
        enter_link(p, &links);
        advance(p);
        jinja_node *n = new_node(p, JINJA_NODE_CONDITIONAL, line);
        n->a = parse_or(p);
        n->b = expr;
        if (is_name(current(p), "else")) {
            advance(p);
            enter(p);
            n->c = parse_condexpr(p);
            leave(p);
        }
        expr = n;
    }
    leave_links(p, links);
    return expr;
}

static jinja_node *parse_and(parser *p);
static jinja_node *parse_not(parser *p);
static jinja_node *parse_compare(parser *p);

static jinja_node *parse_or(parser *p) {
    jinja_node *left = parse_and(p);
    int links = 0;
    while (is_name(current(p), "or")) {
        enter_link(p, &links);
        jinja_node *n = new_node(p, JINJA_NODE_OR, advance(p)->line);
        n->a = left;
        n->b = parse_and(p);
        left = n;
    }
    leave_links(p, links);
    return left;
}

static jinja_node *parse_and(parser *p) {
    jinja_node *left = parse_not(p);
    int links = 0;
    while (is_name(current(p), "and")) {
        enter_link(p, &links);
        jinja_node *n = new_node(p, JINJA_NODE_AND, advance(p)->line);
        n->a = left;
        n->b = parse_not(p);
        left = n;
    }
    leave_links(p, links);
    return left;
}

static jinja_node *parse_not(parser *p) {
    if (is_name(current(p), "not")) {
        jinja_node *n = new_node(p, JINJA_NODE_NOT, advance(p)->line);
        enter(p);
        n->a = parse_not(p);
        leave(p);
        return n;
    }
    return parse_compare(p);
}

static jinja_node *parse_math1(parser *p);

static jinja_node *parse_compare(parser *p) {
    const int line = current(p)->line;
    jinja_node *first = parse_math1(p);
    jinja_node_list operands = {0};
    size_t capacity = 0;
    int ops[64];
    for (;;) {
        const jinja_token *t = current(p);
        int op = -1;
        if (is_op(t, "==")) op = JINJA_COMPARE_EQ;
        else if (is_op(t, "!=")) op = JINJA_COMPARE_NE;
        else if (is_op(t, "<")) op = JINJA_COMPARE_LT;
        else if (is_op(t, "<=")) op = JINJA_COMPARE_LE;
        else if (is_op(t, ">")) op = JINJA_COMPARE_GT;
        else if (is_op(t, ">=")) op = JINJA_COMPARE_GE;
        else if (is_name(t, "in")) op = JINJA_COMPARE_IN;
        else if (is_name(t, "not") && is_name(look(p), "in")) {
            op = JINJA_COMPARE_NOT_IN;
            advance(p);
        }
        if (op < 0) break;
        advance(p);
        if (operands.count == sizeof ops / sizeof ops[0]) parse_fail(p, t->line, "too many chained comparisons");
        ops[operands.count] = op;
        list_push(p, &operands, &capacity, parse_math1(p));
    }
    if (!operands.count) return first;
    jinja_node *n = new_node(p, JINJA_NODE_COMPARE, line);
    n->a = first;
    n->items = operands;
    n->compare_ops = jinja_arena_alloc(p->arena, operands.count * sizeof(int));
    memcpy(n->compare_ops, ops, operands.count * sizeof(int));
    return n;
}

static jinja_node *binary(parser *p, int op, int line, jinja_node *a, jinja_node *b) {
    jinja_node *n = new_node(p, JINJA_NODE_BINARY, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static jinja_node *parse_concat(parser *p);
static jinja_node *parse_math2(parser *p);
static jinja_node *parse_pow(parser *p);

static jinja_node *parse_math1(parser *p) {
    jinja_node *left = parse_concat(p);
    int links = 0;
    for (;;) {
        const jinja_token *t = current(p);
        int op = is_op(t, "+") ? JINJA_OP_ADD : is_op(t, "-") ? JINJA_OP_SUBTRACT : -1;
        if (op < 0) {
            leave_links(p, links);
            return left;
        }
        enter_link(p, &links);
        advance(p);
        left = binary(p, op, t->line, left, parse_concat(p));
    }
}

static jinja_node *parse_concat(parser *p) {
    const int line = current(p)->line;
    jinja_node *first = parse_math2(p);
    if (!is_op(current(p), "~")) return first;
    jinja_node *n = new_node(p, JINJA_NODE_CONCAT, line);
    size_t capacity = 0;
    list_push(p, &n->items, &capacity, first);
    while (is_op(current(p), "~")) {
        advance(p);
        list_push(p, &n->items, &capacity, parse_math2(p));
    }
    return n;
}

static jinja_node *parse_math2(parser *p) {
    jinja_node *left = parse_pow(p);
    int links = 0;
    for (;;) {
        const jinja_token *t = current(p);
        int op = is_op(t, "*")    ? JINJA_OP_MULTIPLY
                 : is_op(t, "/")  ? JINJA_OP_DIVIDE
                 : is_op(t, "//") ? JINJA_OP_FLOOR_DIVIDE
                 : is_op(t, "%")  ? JINJA_OP_MODULO
                                  : -1;
        if (op < 0) {
            leave_links(p, links);
            return left;
        }
        enter_link(p, &links);
        advance(p);
        left = binary(p, op, t->line, left, parse_pow(p));
    }
}

static jinja_node *parse_pow(parser *p) {
    jinja_node *left = parse_unary(p, true);
    int links = 0;
    while (is_op(current(p), "**")) {
        enter_link(p, &links);
        const int line = advance(p)->line;
        left = binary(p, JINJA_OP_POWER, line, left, parse_unary(p, true));
    }
    leave_links(p, links);
    return left;
}

static jinja_node *parse_unary(parser *p, bool with_filter) {
    enter(p);
    const jinja_token *t = current(p);
    jinja_node *node;
    if (is_op(t, "-") || is_op(t, "+")) {
        advance(p);
        node = new_node(p, is_op(t, "-") ? JINJA_NODE_NEGATE : JINJA_NODE_PLUS, t->line);
        node->a = parse_unary(p, false);
    } else {
        node = parse_primary(p);
    }
    node = parse_postfix(p, node);
    if (with_filter) node = parse_filter_expr(p, node);
    leave(p);
    return node;
}

static jinja_node *literal(parser *p, int line, jinja_value value) {
    jinja_node *n = new_node(p, JINJA_NODE_LITERAL, line);
    n->literal = value;
    return n;
}

static void note_name(parser *p, const char *name) {
    if (!p->macro) return;
    if (strcmp(name, "varargs") == 0) p->macro->uses_varargs = true;
    if (strcmp(name, "kwargs") == 0) p->macro->uses_kwargs = true;
    if (strcmp(name, "caller") == 0) p->macro->uses_caller = true;
}

static jinja_node *parse_primary(parser *p) {
    enter(p);
    const jinja_token *t = current(p);
    jinja_node *node = NULL;
    if (t->kind == JINJA_TOKEN_NAME) {
        advance(p);
        const char *s = t->text;
        if (!strcmp(s, "true") || !strcmp(s, "True")) node = literal(p, t->line, jinja_bool(true));
        else if (!strcmp(s, "false") || !strcmp(s, "False")) node = literal(p, t->line, jinja_bool(false));
        else if (!strcmp(s, "none") || !strcmp(s, "None")) node = literal(p, t->line, jinja_none());
        else {
            node = new_node(p, JINJA_NODE_NAME, t->line);
            node->name = s;
            note_name(p, s);
        }
    } else if (t->kind == JINJA_TOKEN_STRING) {
        /* Adjacent string literals join, as in Python. */
        advance(p);
        size_t length = t->length;
        const char *text = t->text;
        while (current(p)->kind == JINJA_TOKEN_STRING) {
            const jinja_token *u = advance(p);
            char *joined = jinja_arena_alloc(p->arena, length + u->length + 1);
            memcpy(joined, text, length);
            memcpy(joined + length, u->text, u->length);
            length += u->length;
            text = joined;
        }
        node = literal(p, t->line, jinja_string(text, length));
    } else if (t->kind == JINJA_TOKEN_INT) {
        advance(p);
        node = literal(p, t->line, jinja_int(t->integer));
    } else if (t->kind == JINJA_TOKEN_FLOAT) {
        advance(p);
        node = literal(p, t->line, jinja_float(t->number));
    } else if (is_op(t, "(")) {
        advance(p);
        node = parse_tuple(p, false, true, NULL, true);
        expect_op(p, ")");
    } else if (is_op(t, "[")) {
        advance(p);
        node = new_node(p, JINJA_NODE_LIST, t->line);
        size_t capacity = 0;
        while (!is_op(current(p), "]")) {
            if (node->items.count) expect_op(p, ",");
            if (is_op(current(p), "]")) break;
            list_push(p, &node->items, &capacity, parse_expression(p, true));
        }
        expect_op(p, "]");
    } else if (is_op(t, "{")) {
        advance(p);
        node = new_node(p, JINJA_NODE_DICT, t->line);
        size_t key_capacity = 0, value_capacity = 0;
        while (!is_op(current(p), "}")) {
            if (node->items.count) expect_op(p, ",");
            if (is_op(current(p), "}")) break;
            list_push(p, &node->items, &key_capacity, parse_expression(p, true));
            expect_op(p, ":");
            list_push(p, &node->values, &value_capacity, parse_expression(p, true));
        }
        expect_op(p, "}");
    } else {
        parse_fail(p, t->line, "unexpected '%s'", describe(t));
    }
    leave(p);
    return node;
}

/* Arguments of a call, a filter or a test: positional, then name=value. */
static void parse_call_args(parser *p, jinja_node *n) {
    expect_op(p, "(");
    size_t capacity = 0, kw_capacity = 0, names_capacity = 0;
    const char **names = NULL;
    while (!is_op(current(p), ")")) {
        if (n->items.count || n->values.count) expect_op(p, ",");
        if (is_op(current(p), ")")) break;
        const jinja_token *t = current(p);
        if (is_op(t, "*") || is_op(t, "**"))
            parse_fail(p, t->line, "'%s' arguments in calls are not supported", t->text);
        if (t->kind == JINJA_TOKEN_NAME && is_op(look(p), "=")) {
            advance(p);
            advance(p);
            if (n->values.count == names_capacity) {
                names_capacity = names_capacity ? names_capacity * 2 : 4;
                const char **grown = jinja_arena_alloc(p->arena, names_capacity * sizeof *grown);
                if (n->values.count) memcpy(grown, names, n->values.count * sizeof *grown);
                names = grown;
            }
            for (size_t k = 0; k < n->values.count; k++)
                if (!strcmp(names[k], t->text)) parse_fail(p, t->line, "keyword argument repeated: %s", t->text);
            names[n->values.count] = t->text;
            list_push(p, &n->values, &kw_capacity, parse_expression(p, true));
        } else {
            if (n->values.count) parse_fail(p, t->line, "invalid syntax for function call expression");
            list_push(p, &n->items, &capacity, parse_expression(p, true));
        }
    }
    n->kwarg_names = names;
    expect_op(p, ")");
}

static jinja_node *parse_call(parser *p, jinja_node *callee) {
    jinja_node *n = new_node(p, JINJA_NODE_CALL, current(p)->line);
    n->a = callee;
    parse_call_args(p, n);
    return n;
}

static jinja_node *parse_subscript(parser *p, jinja_node *node) {
    const jinja_token *t = advance(p);
    if (is_op(t, ".")) {
        const jinja_token *attr = current(p);
        if (attr->kind == JINJA_TOKEN_NAME) {
            advance(p);
            jinja_node *n = new_node(p, JINJA_NODE_GETATTR, t->line);
            n->a = node;
            n->name = attr->text;
            return n;
        }
        if (attr->kind == JINJA_TOKEN_INT) {
            advance(p);
            jinja_node *n = new_node(p, JINJA_NODE_GETITEM, t->line);
            n->a = node;
            n->b = literal(p, attr->line, jinja_int(attr->integer));
            return n;
        }
        parse_fail(p, attr->line, "expected name or number");
    }
    /* `[`: an index or a slice */
    jinja_node *start = NULL;
    if (!is_op(current(p), ":")) {
        start = parse_expression(p, true);
        if (!is_op(current(p), ":")) {
            if (is_op(current(p), ","))
                parse_fail(p, current(p)->line, "tuple subscripts (a[x, y]) are not supported");
            expect_op(p, "]");
            jinja_node *n = new_node(p, JINJA_NODE_GETITEM, t->line);
            n->a = node;
            n->b = start;
            return n;
        }
    }
    jinja_node *n = new_node(p, JINJA_NODE_SLICE, t->line);
    n->a = node;
    n->b = start;
    expect_op(p, ":");
    if (!is_op(current(p), "]") && !is_op(current(p), ",") && !is_op(current(p), ":"))
        n->c = parse_expression(p, true);
    if (is_op(current(p), ":")) {
        advance(p);
        if (!is_op(current(p), "]") && !is_op(current(p), ",")) n->d = parse_expression(p, true);
    }
    if (is_op(current(p), ",")) parse_fail(p, current(p)->line, "tuple subscripts (a[x, y]) are not supported");
    expect_op(p, "]");
    return n;
}

static jinja_node *parse_postfix(parser *p, jinja_node *node) {
    int links = 0;
    for (;;) {
        const jinja_token *t = current(p);
        if (is_op(t, ".") || is_op(t, "[")) {
            enter_link(p, &links);
            node = parse_subscript(p, node);
        } else if (is_op(t, "(")) {
            enter_link(p, &links);
            node = parse_call(p, node);
        } else {
            leave_links(p, links);
            return node;
        }
    }
}

/* `name` or `name.name...` of a filter or test. */
static const char *parse_dotted_name(parser *p) {
    const char *name = expect_name(p);
    while (is_op(current(p), ".")) {
        advance(p);
        const char *part = expect_name(p);
        size_t a = strlen(name), b = strlen(part);
        char *joined = jinja_arena_alloc(p->arena, a + b + 2);
        memcpy(joined, name, a);
        joined[a] = '.';
        memcpy(joined + a + 1, part, b + 1);
        name = joined;
    }
    return name;
}

static jinja_node *parse_filter(parser *p, jinja_node *input, int line) {
    const char *name = parse_dotted_name(p);
    int filter = jinja_filter_lookup(name);
    if (filter < 0) {
        if (jinja_filter_is_jinja2(name)) parse_fail(p, line, "filter '%s' is not supported by kite", name);
        parse_fail(p, line, "No filter named '%s'.", name);
    }
    jinja_node *n = new_node(p, JINJA_NODE_FILTER, line);
    n->a = input;
    n->op = filter;
    n->name = name;
    if (is_op(current(p), "(")) parse_call_args(p, n);
    return n;
}

static jinja_node *parse_test(parser *p, jinja_node *input) {
    const int line = advance(p)->line; /* `is` */
    bool negated = false;
    if (is_name(current(p), "not")) {
        advance(p);
        negated = true;
    }
    const char *name = parse_dotted_name(p);
    int test = jinja_test_lookup(name);
    if (test < 0) {
        if (jinja_test_is_jinja2(name)) parse_fail(p, line, "test '%s' is not supported by kite", name);
        parse_fail(p, line, "No test named '%s'.", name);
    }
    jinja_node *n = new_node(p, JINJA_NODE_TEST, line);
    n->a = input;
    n->op = test;
    n->name = name;
    n->negated = negated;
    const jinja_token *t = current(p);
    if (is_op(t, "(")) {
        parse_call_args(p, n);
        if (n->values.count) parse_fail(p, line, "keyword arguments to tests are not supported");
    } else if ((t->kind == JINJA_TOKEN_NAME || t->kind == JINJA_TOKEN_STRING || t->kind == JINJA_TOKEN_INT ||
                t->kind == JINJA_TOKEN_FLOAT || is_op(t, "[") || is_op(t, "{")) &&
               !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
        if (is_name(t, "is")) parse_fail(p, t->line, "You cannot chain multiple tests with is");
        size_t capacity = 0;
        list_push(p, &n->items, &capacity, parse_postfix(p, parse_primary(p)));
    }
    return n;
}

static jinja_node *parse_filter_expr(parser *p, jinja_node *node) {
    int links = 0;
    for (;;) {
        const jinja_token *t = current(p);
        if (is_op(t, "|")) {
            enter_link(p, &links);
            advance(p);
            node = parse_filter(p, node, t->line);
        } else if (is_name(t, "is")) {
            enter_link(p, &links);
            node = parse_test(p, node);
        } else if (is_op(t, "(")) {
            enter_link(p, &links);
            node = parse_call(p, node);
        } else {
            leave_links(p, links);
            return node;
        }
    }
}

/* ---- statements ------------------------------------------------------------------------------------------ */

static jinja_node_list parse_body(parser *p, const char *const *end_tags);

/* A target of for/set: a name, a tuple of names, or (with_namespace) name.attr. */
static jinja_node *parse_assign_target(parser *p, bool with_namespace, const char *extra_end) {
    const jinja_token *t = current(p);
    if (with_namespace && t->kind == JINJA_TOKEN_NAME && is_op(look(p), ".")) {
        advance(p);
        advance(p);
        jinja_node *n = new_node(p, JINJA_NODE_GETATTR, t->line);
        n->a = new_node(p, JINJA_NODE_NAME, t->line);
        n->a->name = t->text;
        n->name = expect_name(p);
        return n;
    }
    jinja_node *target = parse_tuple(p, true, true, extra_end, false);
    const jinja_node_list *names = target->kind == JINJA_NODE_TUPLE ? &target->items : NULL;
    size_t n = names ? names->count : 1;
    for (size_t i = 0; i < n; i++) {
        const jinja_node *item = names ? names->items[i] : target;
        if (item->kind != JINJA_NODE_NAME)
            parse_fail(p, item->line, "can't assign to '%s'", item->kind == JINJA_NODE_LITERAL ? "const" : "expression");
        if (!strcmp(item->name, "loop") && extra_end && !strcmp(extra_end, "in")) {
            /* jinja2 allows it but then hides the loop object; kite refuses the confusing case. */
            parse_fail(p, item->line, "a loop variable named 'loop' is not supported");
        }
    }
    return target;
}

static void end_tag_error(parser *p, const char *const *end_tags) {
    char expected[256] = "";
    for (size_t i = 0; end_tags && end_tags[i]; i++) {
        size_t used = strlen(expected);
        snprintf(expected + used, sizeof expected - used, "%s'%s'", i ? " or " : "", end_tags[i]);
    }
    parse_fail(p, current(p)->line,
               "Unexpected end of template. Jinja was looking for the following tags: %s. The innermost block that "
               "needs to be closed is '%s'.",
               expected, end_tags && end_tags[0] ? end_tags[0] + 3 : "");
}

static jinja_node *parse_if(parser *p, int line) {
    jinja_node *n = new_node(p, JINJA_NODE_IF, line);
    n->a = parse_tuple(p, false, true, NULL, false);
    expect_block_end(p);
    static const char *const ends[] = {"endif", "elif", "else", NULL};
    n->body = parse_body(p, ends);
    const jinja_token *t = advance(p);
    if (!strcmp(t->text, "elif")) {
        jinja_node *elif = parse_if(p, t->line);
        n->else_body.items = jinja_arena_alloc(p->arena, sizeof(jinja_node *));
        n->else_body.items[0] = elif;
        n->else_body.count = 1;
        return n; /* the elif consumed through endif */
    }
    if (!strcmp(t->text, "else")) {
        expect_block_end(p);
        static const char *const endif[] = {"endif", NULL};
        n->else_body = parse_body(p, endif);
        advance(p);
    }
    expect_block_end(p);
    return n;
}

static jinja_node *parse_for(parser *p, int line) {
    jinja_node *n = new_node(p, JINJA_NODE_FOR, line);
    n->target = parse_assign_target(p, false, "in");
    if (!is_name(current(p), "in")) parse_fail(p, current(p)->line, "expected token 'in', got '%s'", describe(current(p)));
    advance(p);
    n->a = parse_tuple(p, false, false, "recursive", false);
    if (is_name(current(p), "if")) {
        advance(p);
        n->b = parse_expression(p, true);
    }
    if (is_name(current(p), "recursive")) parse_fail(p, current(p)->line, "recursive for loops are not supported");
    expect_block_end(p);
    static const char *const ends[] = {"endfor", "else", NULL};
    p->loop_depth++;
    n->body = parse_body(p, ends);
    p->loop_depth--;
    if (!strcmp(advance(p)->text, "else")) {
        expect_block_end(p);
        static const char *const endfor[] = {"endfor", NULL};
        /* A for's else runs outside the loop: break there is an error, as in jinja2. */
        int saved = p->loop_depth;
        p->loop_depth = 0;
        n->else_body = parse_body(p, endfor);
        p->loop_depth = saved;
        advance(p);
    }
    expect_block_end(p);
    return n;
}

/* `| f(args) | g` after a block set or a filter tag: FILTER nodes with no input. */
static jinja_node_list parse_filter_chain(parser *p, bool first_needs_pipe) {
    jinja_node_list filters = {0};
    size_t capacity = 0;
    bool need_pipe = first_needs_pipe;
    while (!need_pipe || is_op(current(p), "|")) {
        const int line = current(p)->line;
        if (need_pipe) advance(p);
        list_push(p, &filters, &capacity, parse_filter(p, NULL, line));
        need_pipe = true;
    }
    return filters;
}

static jinja_node *parse_set(parser *p, int line) {
    jinja_node *target = parse_assign_target(p, true, NULL);
    if (is_op(current(p), "=")) {
        advance(p);
        jinja_node *n = new_node(p, JINJA_NODE_SET, line);
        n->target = target;
        n->a = parse_tuple(p, false, true, NULL, false);
        expect_block_end(p);
        return n;
    }
    jinja_node *n = new_node(p, JINJA_NODE_SET_BLOCK, line);
    n->target = target;
    if (target->kind == JINJA_NODE_TUPLE) parse_fail(p, line, "a block set assigns one name");
    n->filters = parse_filter_chain(p, true);
    expect_block_end(p);
    static const char *const ends[] = {"endset", NULL};
    n->body = parse_body(p, ends);
    advance(p);
    expect_block_end(p);
    return n;
}

/* `(a, b=default, ...)` of a macro or a call block's caller. */
static void parse_signature(parser *p, jinja_node *n) {
    expect_op(p, "(");
    size_t capacity = 0;
    while (!is_op(current(p), ")")) {
        if (n->n_params) expect_op(p, ",");
        if (is_op(current(p), ")")) break;
        const jinja_token *t = current(p);
        const char *name = expect_name(p);
        for (size_t i = 0; i < n->n_params; i++)
            if (!strcmp(n->params[i], name)) parse_fail(p, t->line, "duplicate argument '%s' in a macro", name);
        if (n->n_params == capacity) {
            capacity = capacity ? capacity * 2 : 4;
            const char **params = jinja_arena_alloc(p->arena, capacity * sizeof *params);
            jinja_node **defaults = jinja_arena_alloc(p->arena, capacity * sizeof *defaults);
            if (n->n_params) {
                memcpy(params, n->params, n->n_params * sizeof *params);
                memcpy(defaults, n->defaults, n->n_params * sizeof *defaults);
            }
            n->params = params;
            n->defaults = defaults;
        }
        n->params[n->n_params] = name;
        if (is_op(current(p), "=")) {
            advance(p);
            n->defaults[n->n_params] = parse_expression(p, true);
        } else if (n->n_params && n->defaults[n->n_params - 1]) {
            parse_fail(p, t->line, "non-default argument follows default argument");
        }
        n->n_params++;
    }
    expect_op(p, ")");
}

static jinja_node *parse_macro(parser *p, int line) {
    jinja_node *n = new_node(p, JINJA_NODE_MACRO, line);
    n->name = expect_name(p);
    parse_signature(p, n);
    expect_block_end(p);
    jinja_node *saved_macro = p->macro;
    int saved_loops = p->loop_depth;
    p->macro = n;
    p->loop_depth = 0;
    static const char *const ends[] = {"endmacro", NULL};
    n->body = parse_body(p, ends);
    p->macro = saved_macro;
    p->loop_depth = saved_loops;
    advance(p);
    expect_block_end(p);
    return n;
}

static jinja_node *parse_call_block(parser *p, int line) {
    jinja_node *n = new_node(p, JINJA_NODE_CALL_BLOCK, line);
    if (is_op(current(p), "(")) parse_signature(p, n);
    n->a = parse_expression(p, true);
    if (n->a->kind != JINJA_NODE_CALL) parse_fail(p, line, "expected call");
    expect_block_end(p);
    jinja_node *saved_macro = p->macro;
    int saved_loops = p->loop_depth;
    p->macro = n;
    p->loop_depth = 0;
    static const char *const ends[] = {"endcall", NULL};
    n->body = parse_body(p, ends);
    p->macro = saved_macro;
    p->loop_depth = saved_loops;
    advance(p);
    expect_block_end(p);
    return n;
}

static jinja_node *parse_filter_block(parser *p, int line) {
    jinja_node *n = new_node(p, JINJA_NODE_FILTER_BLOCK, line);
    n->filters = parse_filter_chain(p, false);
    expect_block_end(p);
    static const char *const ends[] = {"endfilter", NULL};
    n->body = parse_body(p, ends);
    advance(p);
    expect_block_end(p);
    return n;
}

static jinja_node *parse_statement(parser *p) {
    const jinja_token *t = current(p);
    if (t->kind != JINJA_TOKEN_NAME) parse_fail(p, t->line, "tag name expected");
    const char *tag = t->text;
    advance(p);
    enter(p);
    jinja_node *n = NULL;
    if (!strcmp(tag, "if")) n = parse_if(p, t->line);
    else if (!strcmp(tag, "for")) n = parse_for(p, t->line);
    else if (!strcmp(tag, "set")) n = parse_set(p, t->line);
    else if (!strcmp(tag, "macro")) n = parse_macro(p, t->line);
    else if (!strcmp(tag, "call")) n = parse_call_block(p, t->line);
    else if (!strcmp(tag, "filter")) n = parse_filter_block(p, t->line);
    else if (!strcmp(tag, "break") || !strcmp(tag, "continue")) {
        if (p->loop_depth == 0) parse_fail(p, t->line, "'%s' outside a for loop", tag);
        n = new_node(p, !strcmp(tag, "break") ? JINJA_NODE_BREAK : JINJA_NODE_CONTINUE, t->line);
        expect_block_end(p);
    } else {
        static const char *const unsupported[] = {"include", "import", "from", "extends", "block", "with",
                                                  "autoescape", "do", "trans", "print", "raw", NULL};
        for (size_t i = 0; unsupported[i]; i++)
            if (!strcmp(tag, unsupported[i])) parse_fail(p, t->line, "the '%s' tag is not supported by kite", tag);
        parse_fail(p, t->line, "Encountered unknown tag '%s'.", tag);
    }
    leave(p);
    return n;
}

/* Statements and text up to EOF (end_tags NULL) or a `{% tag` whose name is in end_tags; then the current token
 * is that tag's name. */
static jinja_node_list parse_body(parser *p, const char *const *end_tags) {
    jinja_node_list body = {0};
    size_t capacity = 0;
    for (;;) {
        const jinja_token *t = current(p);
        if (t->kind == JINJA_TOKEN_EOF) {
            if (end_tags) end_tag_error(p, end_tags);
            return body;
        }
        if (t->kind == JINJA_TOKEN_TEXT) {
            advance(p);
            jinja_node *n = new_node(p, JINJA_NODE_TEXT, t->line);
            n->literal = jinja_string(t->text, t->length);
            list_push(p, &body, &capacity, n);
        } else if (t->kind == JINJA_TOKEN_VAR_BEGIN) {
            advance(p);
            jinja_node *n = new_node(p, JINJA_NODE_OUTPUT, t->line);
            n->a = parse_tuple(p, false, true, NULL, false);
            if (current(p)->kind != JINJA_TOKEN_VAR_END)
                parse_fail(p, current(p)->line, "expected token 'end of print statement', got '%s'",
                           describe(current(p)));
            advance(p);
            list_push(p, &body, &capacity, n);
        } else if (t->kind == JINJA_TOKEN_BLOCK_BEGIN) {
            const jinja_token *tag = look(p);
            for (size_t i = 0; end_tags && end_tags[i]; i++)
                if (is_name(tag, end_tags[i])) {
                    advance(p);
                    return body;
                }
            advance(p);
            list_push(p, &body, &capacity, parse_statement(p));
        } else {
            parse_fail(p, t->line, "unexpected '%s'", describe(t));
        }
    }
}

/* Lexes and parses into t; failures jump to t->arena.on_fail. */
static void parse_into(jinja_template *t, const char *source, size_t length, const char *name) {
    t->name = jinja_arena_strndup(&t->arena, name, strlen(name));
    jinja_token_list tokens;
    jinja_lex(&t->arena, source, length, t->name, &tokens);
    parser p = {.arena = &t->arena, .name = t->name, .tokens = tokens.tokens, .count = tokens.count};
    t->body = parse_body(&p, NULL);
}

kite_status jinja_parse(const char *source, size_t length, const char *name, jinja_template **out) {
    if (!out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "jinja_parse: no output");
    *out = NULL;
    if (!source && length) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "jinja_parse: no source");
    jinja_template *t = calloc(1, sizeof *t);
    if (!t) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory", name ? name : "template");
    jmp_buf on_fail;
    t->arena.limit = JINJA_MAX_ARENA_BYTES;
    t->arena.on_fail = &on_fail;
    if (setjmp(on_fail) != 0) {
        kite_status status = t->arena.status;
        jinja_arena_free(&t->arena);
        free(t);
        return status;
    }
    parse_into(t, source ? source : "", length, name ? name : "template");
    t->arena.on_fail = NULL;
    *out = t;
    return KITE_OK;
}

void jinja_free(jinja_template *template_) {
    if (!template_) return;
    jinja_arena_free(&template_->arena);
    free(template_);
}

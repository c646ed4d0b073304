/* The interpreter: runs a parsed template's statements and evaluates its expressions with jinja2's semantics.
 *
 * Scopes are as jinja2 compiles them: the template has one scope; every iteration of a for loop gets a fresh
 * one (a `set` inside a loop never leaks out, which is why templates use namespace()); a macro call and a call
 * block's caller get their own, whose parent is the scope the macro was defined in; so do a block set's and a
 * filter block's bodies; `if` opens none. A name is
 * looked up from the innermost scope out, then among the render's variables and the global functions;
 * a name found nowhere is undefined.
 * Operators follow Python on jinja2's values (int64 integers: an overflow is an error, never a wrong number;
 * `%` on strings is refused). Every statement and expression counts against JINJA_MAX_STEPS, output against
 * JINJA_MAX_OUTPUT_BYTES, memory against JINJA_MAX_ARENA_BYTES, macro calls against JINJA_MAX_MACRO_DEPTH.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja_internal.h"
#include "util/error.h"

struct jinja_frame {
    jinja_frame *parent;
    jinja_dict vars;
    bool captured; /* a macro defined in it (or below) keeps it as its closure: it cannot be reused */
};

typedef enum flow { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE } flow;

_Noreturn void jinja_runtime_error(jinja_render_context *ctx, const char *fmt, ...) {
    char message[768];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    ctx->arena.status =
        kite_fail(KITE_ERROR_INVALID_INPUT, "%s:%d: %s", ctx->template_->name, ctx->line, message);
    longjmp(ctx->on_fail, 1);
}

void jinja_count_steps(jinja_render_context *ctx, uint64_t n) {
    ctx->steps += n;
    if (ctx->steps > JINJA_MAX_STEPS)
        jinja_runtime_error(ctx, "the template ran past its limit of %llu steps", (unsigned long long)JINJA_MAX_STEPS);
}

static jinja_frame *push_frame(jinja_render_context *ctx, jinja_frame *parent) {
    jinja_frame *f = jinja_arena_alloc(&ctx->arena, sizeof *f);
    f->parent = parent;
    return f;
}

static jinja_value lookup(jinja_render_context *ctx, const char *name) {
    jinja_value key = jinja_cstring(name);
    for (jinja_frame *f = ctx->frame; f; f = f->parent) {
        jinja_value *v = jinja_dict_get(&f->vars, key);
        if (v) return *v;
    }
    jinja_value *v = jinja_dict_get(ctx->globals, key);
    if (v) return *v;
    size_t n = strlen(name) + 20;
    char *message = jinja_arena_alloc(&ctx->arena, n);
    snprintf(message, n, "'%s' is undefined", name);
    return jinja_undefined(message);
}

static void assign(jinja_render_context *ctx, const char *name, jinja_value value) {
    jinja_dict_set(ctx, &ctx->frame->vars, jinja_cstring(name), value);
}

/* ---- output ----------------------------------------------------------------------------------------------- */

static void check_output(jinja_render_context *ctx) {
    if (!ctx->out->failed) return;
    if (ctx->out->over_limit)
        jinja_runtime_error(ctx, "the output is past its limit of %zu MiB", JINJA_MAX_OUTPUT_BYTES >> 20);
    jinja_runtime_error(ctx, "out of memory");
}

text_builder *jinja_capture_push(jinja_render_context *ctx) {
    if (ctx->n_captures == (int)(sizeof ctx->captures / sizeof ctx->captures[0]))
        jinja_runtime_error(ctx, "macro calls, block sets and tojson nest too deeply");
    size_t used = ctx->result->length;
    for (int i = 0; i < ctx->n_captures; i++) used += ctx->captures[i].length;
    if (used >= JINJA_MAX_OUTPUT_BYTES)
        jinja_runtime_error(ctx, "the output is past its limit of %zu MiB", JINJA_MAX_OUTPUT_BYTES >> 20);
    text_builder *b = &ctx->captures[ctx->n_captures++];
    *b = (text_builder){.limit = JINJA_MAX_OUTPUT_BYTES - used};
    return b;
}

jinja_value jinja_capture_pop(jinja_render_context *ctx) {
    text_builder *b = &ctx->captures[ctx->n_captures - 1];
    if (b->failed) {
        if (b->over_limit)
            jinja_runtime_error(ctx, "the output is past its limit of %zu MiB", JINJA_MAX_OUTPUT_BYTES >> 20);
        jinja_runtime_error(ctx, "out of memory");
    }
    /* Copy first: the arena may fail, and the builder must still be on the list the unwind frees. */
    jinja_value s = jinja_string_copy(ctx, b->data ? b->data : "", b->length);
    text_builder_free(b);
    ctx->n_captures--;
    return s;
}

static text_builder *capture_begin(jinja_render_context *ctx) {
    text_builder *saved = ctx->out;
    ctx->out = jinja_capture_push(ctx);
    return saved;
}

static jinja_value capture_end(jinja_render_context *ctx, text_builder *saved) {
    check_output(ctx);
    jinja_value s = jinja_capture_pop(ctx);
    ctx->out = saved;
    return s;
}

/* ---- expressions ------------------------------------------------------------------------------------------- */

static jinja_value eval(jinja_render_context *ctx, const jinja_node *n);
static flow exec_body(jinja_render_context *ctx, const jinja_node_list *body);

static bool is_number(jinja_value v) { return v.kind == JINJA_INT || v.kind == JINJA_BOOL || v.kind == JINJA_FLOAT; }
static int64_t int_of(jinja_value v) { return v.kind == JINJA_INT ? v.as.integer : (int64_t)v.as.boolean; }
static double float_of(jinja_value v) { return v.kind == JINJA_FLOAT ? v.as.number : (double)int_of(v); }

static _Noreturn void operand_error(jinja_render_context *ctx, const char *op, jinja_value a, jinja_value b) {
    jinja_check_defined(ctx, a);
    jinja_check_defined(ctx, b);
    jinja_runtime_error(ctx, "unsupported operand type(s) for %s: '%s' and '%s'", op, jinja_type_name(a),
                        jinja_type_name(b));
}

static jinja_value concat_strings(jinja_render_context *ctx, jinja_value a, jinja_value b) {
    size_t n = a.as.string.length + b.as.string.length;
    char *s = jinja_arena_alloc(&ctx->arena, n + 1);
    memcpy(s, a.as.string.data, a.as.string.length);
    memcpy(s + a.as.string.length, b.as.string.data, b.as.string.length);
    return jinja_string(s, n);
}

static jinja_value repeat(jinja_render_context *ctx, jinja_value sequence, int64_t times) {
    if (times < 0) times = 0;
    if (sequence.kind == JINJA_STRING) {
        size_t n = sequence.as.string.length;
        if (n && (uint64_t)times > JINJA_MAX_ARENA_BYTES / n)
            jinja_runtime_error(ctx, "a string repeated %lld times is past the memory limit", (long long)times);
        char *s = jinja_arena_alloc(&ctx->arena, n * (size_t)times + 1);
        for (int64_t i = 0; i < times; i++) memcpy(s + (size_t)i * n, sequence.as.string.data, n);
        jinja_count_steps(ctx, (uint64_t)times / 64);
        return jinja_string(s, n * (size_t)times);
    }
    const jinja_list *items = sequence.as.list;
    if (items->count && (uint64_t)times > JINJA_MAX_ARENA_BYTES / sizeof(jinja_value) / items->count)
        jinja_runtime_error(ctx, "a list repeated %lld times is past the memory limit", (long long)times);
    jinja_value out = jinja_new_list(ctx, sequence.kind, items->count * (size_t)times);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < items->count; k++) jinja_list_push(ctx, out.as.list, items->items[k]);
    jinja_count_steps(ctx, items->count * (uint64_t)times);
    return out;
}

static jinja_value python_floor_divide(jinja_render_context *ctx, jinja_value a, jinja_value b, bool want_mod) {
    if (a.kind != JINJA_FLOAT && b.kind != JINJA_FLOAT) {
        int64_t x = int_of(a), y = int_of(b);
        if (y == 0) jinja_runtime_error(ctx, "%s", want_mod ? "integer modulo by zero" : "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) {
            if (want_mod) return jinja_int(0);
            jinja_runtime_error(ctx, "integer overflow (kite's integers are 64-bit)");
        }
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
            q--;
            r += y;
        }
        return want_mod ? jinja_int(r) : jinja_int(q);
    }
    double x = float_of(a), y = float_of(b);
    if (y == 0.0) jinja_runtime_error(ctx, "%s", want_mod ? "float modulo" : "float floor division by zero");
    /* CPython's float_divmod */
    double mod = fmod(x, y);
    double div = (x - mod) / y;
    if (mod != 0.0) {
        if ((y < 0) != (mod < 0)) {
            mod += y;
            div -= 1.0;
        }
    } else {
        mod = copysign(0.0, y);
    }
    double floordiv;
    if (div != 0.0) {
        floordiv = floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
        floordiv = copysign(0.0, x / y);
    }
    return want_mod ? jinja_float(mod) : jinja_float(floordiv);
}

static jinja_value binary(jinja_render_context *ctx, int op, jinja_value a, jinja_value b) {
    static const char *const symbols[] = {"+", "-", "*", "/", "//", "%", "**"};
    const char *symbol = symbols[op];
    const bool numbers = is_number(a) && is_number(b);
    const bool ints = numbers && a.kind != JINJA_FLOAT && b.kind != JINJA_FLOAT;
    int64_t r;
    switch (op) {
    case JINJA_OP_ADD:
        if (ints) {
            if (__builtin_add_overflow(int_of(a), int_of(b), &r)) break;
            return jinja_int(r);
        }
        if (numbers) return jinja_float(float_of(a) + float_of(b));
        if (a.kind == JINJA_STRING && b.kind == JINJA_STRING) {
            if (!a.markup && !b.markup) return concat_strings(ctx, a, b);
            /* Markup + str escapes the str (markupsafe's __add__ / __radd__). */
            jinja_value sum = concat_strings(ctx, a.markup ? a : jinja_html_escape(ctx, a),
                                             b.markup ? b : jinja_html_escape(ctx, b));
            sum.markup = true;
            return sum;
        }
        if ((a.kind == JINJA_LIST || a.kind == JINJA_TUPLE) && a.kind == b.kind) {
            jinja_value out = jinja_new_list(ctx, a.kind, a.as.list->count + b.as.list->count);
            for (size_t i = 0; i < a.as.list->count; i++) jinja_list_push(ctx, out.as.list, a.as.list->items[i]);
            for (size_t i = 0; i < b.as.list->count; i++) jinja_list_push(ctx, out.as.list, b.as.list->items[i]);
            jinja_count_steps(ctx, out.as.list->count);
            return out;
        }
        operand_error(ctx, symbol, a, b);
    case JINJA_OP_SUBTRACT:
        if (ints) {
            if (__builtin_sub_overflow(int_of(a), int_of(b), &r)) break;
            return jinja_int(r);
        }
        if (numbers) return jinja_float(float_of(a) - float_of(b));
        operand_error(ctx, symbol, a, b);
    case JINJA_OP_MULTIPLY:
        if (ints) {
            if (__builtin_mul_overflow(int_of(a), int_of(b), &r)) break;
            return jinja_int(r);
        }
        if (numbers) return jinja_float(float_of(a) * float_of(b));
        if ((a.kind == JINJA_STRING || a.kind == JINJA_LIST || a.kind == JINJA_TUPLE) &&
            (b.kind == JINJA_INT || b.kind == JINJA_BOOL))
            return repeat(ctx, a, int_of(b));
        if ((b.kind == JINJA_STRING || b.kind == JINJA_LIST || b.kind == JINJA_TUPLE) &&
            (a.kind == JINJA_INT || a.kind == JINJA_BOOL))
            return repeat(ctx, b, int_of(a));
        operand_error(ctx, symbol, a, b);
    case JINJA_OP_DIVIDE:
        if (numbers) {
            if (float_of(b) == 0.0) jinja_runtime_error(ctx, "division by zero");
            return jinja_float(float_of(a) / float_of(b));
        }
        operand_error(ctx, symbol, a, b);
    case JINJA_OP_FLOOR_DIVIDE:
        if (numbers) return python_floor_divide(ctx, a, b, false);
        operand_error(ctx, symbol, a, b);
    case JINJA_OP_MODULO:
        if (numbers) return python_floor_divide(ctx, a, b, true);
        if (a.kind == JINJA_STRING)
            jinja_runtime_error(ctx, "string formatting with '%%' is not supported by kite");
        operand_error(ctx, symbol, a, b);
    case JINJA_OP_POWER:
        if (ints && int_of(b) >= 0) {
            int64_t base = int_of(a), exponent = int_of(b), result = 1;
            while (exponent > 0) {
                if (exponent & 1) {
                    if (__builtin_mul_overflow(result, base, &result)) goto overflow;
                }
                exponent >>= 1;
                if (exponent && __builtin_mul_overflow(base, base, &base)) goto overflow;
            }
            return jinja_int(result);
        }
        if (numbers) {
            double x = float_of(a), y = float_of(b);
            if (x == 0.0 && y < 0) jinja_runtime_error(ctx, "0.0 cannot be raised to a negative power");
            if (x < 0 && y != floor(y)) jinja_runtime_error(ctx, "a negative number to a fractional power is complex");
            return jinja_float(pow(x, y));
        }
        operand_error(ctx, symbol, a, b);
    }
overflow:
    jinja_runtime_error(ctx, "integer overflow in '%s' (kite's integers are 64-bit)", symbol);
}

static bool contains(jinja_render_context *ctx, jinja_value container, jinja_value item) {
    switch (container.kind) {
    case JINJA_UNDEFINED: return false;
    case JINJA_STRING: {
        if (item.kind != JINJA_STRING) {
            jinja_check_defined(ctx, item);
            jinja_runtime_error(ctx, "'in <string>' requires string as left operand, not %s", jinja_type_name(item));
        }
        size_t n = item.as.string.length, h = container.as.string.length;
        if (n == 0) return true;
        for (size_t i = 0; i + n <= h; i++)
            if (memcmp(container.as.string.data + i, item.as.string.data, n) == 0) return true;
        jinja_count_steps(ctx, h / 256);
        return false;
    }
    case JINJA_LIST:
    case JINJA_TUPLE:
        jinja_count_steps(ctx, container.as.list->count);
        for (size_t i = 0; i < container.as.list->count; i++)
            if (jinja_equal(ctx, container.as.list->items[i], item)) return true;
        return false;
    case JINJA_DICT: jinja_check_hashable(ctx, item); return jinja_dict_get(container.as.dict, item) != NULL;
    case JINJA_ITERATOR: {
        /* Python consumes a generator up to the item it finds. */
        jinja_iterator *it = container.as.iterator;
        while (it->position < it->items->count)
            if (jinja_equal(ctx, it->items->items[it->position++], item)) return true;
        return false;
    }
    default: jinja_runtime_error(ctx, "argument of type '%s' is not iterable", jinja_type_name(container));
    }
}

static bool compare(jinja_render_context *ctx, int op, jinja_value a, jinja_value b) {
    switch (op) {
    case JINJA_COMPARE_EQ: return jinja_equal(ctx, a, b);
    case JINJA_COMPARE_NE: return !jinja_equal(ctx, a, b);
    case JINJA_COMPARE_LT: return jinja_compare(ctx, a, b) < 0;
    case JINJA_COMPARE_LE: return jinja_compare(ctx, a, b) <= 0;
    case JINJA_COMPARE_GT: return jinja_compare(ctx, a, b) > 0;
    case JINJA_COMPARE_GE: return jinja_compare(ctx, a, b) >= 0;
    case JINJA_COMPARE_IN: return contains(ctx, b, a);
    default: return !contains(ctx, b, a);
    }
}

/* A Python slice index: an int (bool counts), or None / missing. */
static bool slice_index(jinja_render_context *ctx, const jinja_node *n, int64_t *out) {
    if (!n) return false;
    jinja_value v = eval(ctx, n);
    if (v.kind == JINJA_NONE) return false;
    if (v.kind != JINJA_INT && v.kind != JINJA_BOOL) {
        jinja_check_defined(ctx, v);
        jinja_runtime_error(ctx, "slice indices must be integers or None");
    }
    *out = int_of(v);
    return true;
}

/* CPython's PySlice_AdjustIndices over `length` elements. */
static size_t slice_positions(int64_t length, bool has_start, int64_t start, bool has_stop, int64_t stop,
                              int64_t step, int64_t *first) {
    if (!has_start) start = step < 0 ? length - 1 : 0;
    else if (start < 0) {
        start += length;
        if (start < 0) start = step < 0 ? -1 : 0;
    } else if (start >= length) start = step < 0 ? length - 1 : length;
    if (!has_stop) stop = step < 0 ? -1 : length;
    else if (stop < 0) {
        stop += length;
        if (stop < 0) stop = step < 0 ? -1 : 0;
    } else if (stop >= length) stop = step < 0 ? length - 1 : length;
    *first = start;
    if (step < 0) return stop < start ? (size_t)((start - stop - 1) / (-step) + 1) : 0;
    return start < stop ? (size_t)((stop - start - 1) / step + 1) : 0;
}

static jinja_value eval_slice(jinja_render_context *ctx, const jinja_node *n) {
    jinja_value object = eval(ctx, n->a);
    int64_t start = 0, stop = 0, step = 1;
    bool has_start = slice_index(ctx, n->b, &start);
    bool has_stop = slice_index(ctx, n->c, &stop);
    if (slice_index(ctx, n->d, &step) && step == 0) jinja_runtime_error(ctx, "slice step cannot be zero");
    jinja_check_defined(ctx, object);
    if (object.kind == JINJA_STRING) {
        /* Code points, not bytes: index them first. */
        const char *s = object.as.string.data;
        size_t bytes = object.as.string.length;
        size_t count = jinja_utf8_count(s, bytes);
        size_t *offsets = jinja_arena_alloc(&ctx->arena, (count + 1) * sizeof *offsets);
        size_t at = 0;
        for (size_t i = 0; i < count; i++) {
            offsets[i] = at;
            jinja_utf8_next(s, bytes, &at);
        }
        offsets[count] = bytes;
        int64_t first;
        size_t n_out = slice_positions((int64_t)count, has_start, start, has_stop, stop, step, &first);
        if (step == 1) {
            size_t from = offsets[first], to = offsets[(size_t)first + n_out];
            return jinja_string(s + from, to - from);
        }
        char *out = jinja_arena_alloc(&ctx->arena, bytes + 1);
        size_t length = 0;
        for (size_t i = 0; i < n_out; i++) {
            size_t k = (size_t)(first + (int64_t)i * step);
            memcpy(out + length, s + offsets[k], offsets[k + 1] - offsets[k]);
            length += offsets[k + 1] - offsets[k];
        }
        jinja_count_steps(ctx, n_out);
        return jinja_string(out, length);
    }
    if (object.kind == JINJA_LIST || object.kind == JINJA_TUPLE) {
        const jinja_list *items = object.as.list;
        int64_t first;
        size_t n_out = slice_positions((int64_t)items->count, has_start, start, has_stop, stop, step, &first);
        jinja_value out = jinja_new_list(ctx, object.kind, n_out);
        for (size_t i = 0; i < n_out; i++)
            jinja_list_push(ctx, out.as.list, items->items[(size_t)(first + (int64_t)i * step)]);
        jinja_count_steps(ctx, n_out);
        return out;
    }
    if (object.kind == JINJA_DICT) jinja_runtime_error(ctx, "unhashable type: 'slice'");
    jinja_runtime_error(ctx, "'%s' object is not subscriptable", jinja_type_name(object));
}

typedef struct call_args {
    jinja_value *args;
    size_t n_args;
    const char **kwarg_names;
    jinja_value *kwargs;
    size_t n_kwargs;
} call_args;

static call_args eval_args(jinja_render_context *ctx, const jinja_node *n) {
    call_args c = {.n_args = n->items.count, .kwarg_names = n->kwarg_names, .n_kwargs = n->values.count};
    if (c.n_args) c.args = jinja_arena_alloc(&ctx->arena, c.n_args * sizeof *c.args);
    if (c.n_kwargs) c.kwargs = jinja_arena_alloc(&ctx->arena, c.n_kwargs * sizeof *c.kwargs);
    for (size_t i = 0; i < c.n_args; i++) c.args[i] = eval(ctx, n->items.items[i]);
    for (size_t i = 0; i < c.n_kwargs; i++) c.kwargs[i] = eval(ctx, n->values.items[i]);
    return c;
}

static jinja_value call_macro(jinja_render_context *ctx, const jinja_macro *macro, const call_args *c,
                              jinja_value caller) {
    const jinja_node *m = macro->node;
    const char *name = m->kind == JINJA_NODE_MACRO ? m->name : "caller";
    if (ctx->macro_depth >= JINJA_MAX_MACRO_DEPTH)
        jinja_runtime_error(ctx, "macro calls nest deeper than %d", JINJA_MAX_MACRO_DEPTH);
    if (caller.kind != JINJA_UNDEFINED && !m->uses_caller)
        jinja_runtime_error(ctx, "macro '%s' was invoked with two values for the special caller argument. This is "
                                 "most likely a bug.", name);
    if (c->n_args > m->n_params && !m->uses_varargs)
        jinja_runtime_error(ctx, "macro '%s' takes not more than %zu argument(s)", name, m->n_params);
    jinja_frame *saved_frame = ctx->frame;
    const int saved_line = ctx->line;
    ctx->frame = push_frame(ctx, macro->closure);
    jinja_value kwargs = jinja_new_dict(ctx, JINJA_DICT);
    for (size_t k = 0; k < c->n_kwargs; k++) {
        bool is_param = false;
        for (size_t i = 0; i < m->n_params; i++)
            if (!strcmp(m->params[i], c->kwarg_names[k])) {
                if (i < c->n_args) jinja_runtime_error(ctx, "macro '%s' got multiple values for argument '%s'", name, m->params[i]);
                is_param = true;
            }
        if (!is_param) {
            if (!m->uses_kwargs)
                jinja_runtime_error(ctx, "macro '%s' takes no keyword argument '%s'", name, c->kwarg_names[k]);
            jinja_dict_set(ctx, kwargs.as.dict, jinja_cstring(c->kwarg_names[k]), c->kwargs[k]);
        }
    }
    for (size_t i = 0; i < m->n_params; i++) {
        jinja_value value;
        bool given = false;
        if (i < c->n_args) {
            value = c->args[i];
            given = true;
        }
        for (size_t k = 0; !given && k < c->n_kwargs; k++)
            if (!strcmp(m->params[i], c->kwarg_names[k])) {
                value = c->kwargs[k];
                given = true;
            }
        if (!given) {
            if (m->defaults[i]) {
                value = eval(ctx, m->defaults[i]);
            } else {
                size_t length = strlen(m->params[i]) + 40;
                char *message = jinja_arena_alloc(&ctx->arena, length);
                snprintf(message, length, "parameter '%s' was not provided", m->params[i]);
                value = jinja_undefined(message);
            }
        }
        assign(ctx, m->params[i], value);
    }
    if (m->uses_varargs) {
        jinja_value varargs = jinja_new_list(ctx, JINJA_TUPLE, 0);
        for (size_t i = m->n_params; i < c->n_args; i++) jinja_list_push(ctx, varargs.as.list, c->args[i]);
        assign(ctx, "varargs", varargs);
    }
    if (m->uses_kwargs) assign(ctx, "kwargs", kwargs);
    if (m->uses_caller && caller.kind != JINJA_UNDEFINED) assign(ctx, "caller", caller);
    ctx->macro_depth++;
    text_builder *saved_out = capture_begin(ctx);
    exec_body(ctx, &m->body);
    jinja_value result = capture_end(ctx, saved_out);
    ctx->macro_depth--;
    ctx->frame = saved_frame;
    ctx->line = saved_line;
    return result;
}

jinja_value jinja_call_value(jinja_render_context *ctx, jinja_value callee, const jinja_value *args, size_t n_args,
                             const char **kwarg_names, const jinja_value *kwargs, size_t n_kwargs) {
    call_args c = {(jinja_value *)args, n_args, kwarg_names, (jinja_value *)kwargs, n_kwargs};
    switch (callee.kind) {
    case JINJA_MACRO: return call_macro(ctx, callee.as.macro, &c, jinja_undefined(NULL));
    case JINJA_METHOD: return jinja_call_method(ctx, callee.as.method, args, n_args, kwarg_names, kwargs, n_kwargs);
    case JINJA_FUNCTION:
        return jinja_call_function(ctx, callee.as.function, args, n_args, kwarg_names, kwargs, n_kwargs);
    case JINJA_UNDEFINED: jinja_check_defined(ctx, callee); /* fails with the undefined's message */
    /* fallthrough */
    default: jinja_runtime_error(ctx, "'%s' object is not callable", jinja_type_name(callee));
    }
}

static jinja_value eval_call(jinja_render_context *ctx, const jinja_node *n, jinja_value caller) {
    jinja_value callee = eval(ctx, n->a);
    call_args c = eval_args(ctx, n);
    ctx->line = n->line;
    if (callee.kind == JINJA_MACRO) return call_macro(ctx, callee.as.macro, &c, caller);
    return jinja_call_value(ctx, callee, c.args, c.n_args, c.kwarg_names, c.kwargs, c.n_kwargs);
}

static jinja_value eval_filter(jinja_render_context *ctx, const jinja_node *n, jinja_value input) {
    call_args c = eval_args(ctx, n);
    ctx->line = n->line;
    return jinja_apply_filter(ctx, n->op, input, c.args, c.n_args, c.kwarg_names, c.kwargs, c.n_kwargs);
}

static jinja_value eval(jinja_render_context *ctx, const jinja_node *n) {
    jinja_count_steps(ctx, 1);
    ctx->line = n->line;
    switch (n->kind) {
    case JINJA_NODE_LITERAL: return n->literal;
    case JINJA_NODE_NAME: return lookup(ctx, n->name);
    case JINJA_NODE_LIST:
    case JINJA_NODE_TUPLE: {
        jinja_value list = jinja_new_list(ctx, n->kind == JINJA_NODE_LIST ? JINJA_LIST : JINJA_TUPLE, n->items.count);
        for (size_t i = 0; i < n->items.count; i++) jinja_list_push(ctx, list.as.list, eval(ctx, n->items.items[i]));
        return list;
    }
    case JINJA_NODE_DICT: {
        jinja_value dict = jinja_new_dict(ctx, JINJA_DICT);
        for (size_t i = 0; i < n->items.count; i++) {
            jinja_value key = eval(ctx, n->items.items[i]);
            jinja_value value = eval(ctx, n->values.items[i]);
            jinja_check_hashable(ctx, key);
            if (key.kind == JINJA_TUPLE) jinja_runtime_error(ctx, "tuple dict keys are not supported by kite");
            jinja_dict_set(ctx, dict.as.dict, key, value);
        }
        return dict;
    }
    case JINJA_NODE_GETATTR: {
        jinja_value object = eval(ctx, n->a);
        ctx->line = n->line;
        return jinja_get_attribute(ctx, object, n->name);
    }
    case JINJA_NODE_GETITEM: {
        jinja_value object = eval(ctx, n->a);
        jinja_value key = eval(ctx, n->b);
        ctx->line = n->line;
        return jinja_get_item(ctx, object, key);
    }
    case JINJA_NODE_SLICE: return eval_slice(ctx, n);
    case JINJA_NODE_CALL: return eval_call(ctx, n, jinja_undefined(NULL));
    case JINJA_NODE_FILTER: return eval_filter(ctx, n, eval(ctx, n->a));
    case JINJA_NODE_TEST: {
        jinja_value input = eval(ctx, n->a);
        call_args c = eval_args(ctx, n);
        ctx->line = n->line;
        bool result = jinja_apply_test(ctx, n->op, input, c.args, c.n_args);
        return jinja_bool(n->negated ? !result : result);
    }
    case JINJA_NODE_NEGATE:
    case JINJA_NODE_PLUS: {
        jinja_value v = eval(ctx, n->a);
        ctx->line = n->line;
        if (n->kind == JINJA_NODE_PLUS && is_number(v)) return v.kind == JINJA_BOOL ? jinja_int(v.as.boolean) : v;
        if (v.kind == JINJA_FLOAT) return jinja_float(-v.as.number);
        if (v.kind == JINJA_INT || v.kind == JINJA_BOOL) {
            if (int_of(v) == INT64_MIN) jinja_runtime_error(ctx, "integer overflow (kite's integers are 64-bit)");
            return jinja_int(-int_of(v));
        }
        jinja_check_defined(ctx, v);
        jinja_runtime_error(ctx, "bad operand type for unary %s: '%s'", n->kind == JINJA_NODE_NEGATE ? "-" : "+",
                            jinja_type_name(v));
    }
    case JINJA_NODE_NOT: return jinja_bool(!jinja_truthy(eval(ctx, n->a)));
    case JINJA_NODE_BINARY: {
        jinja_value a = eval(ctx, n->a);
        jinja_value b = eval(ctx, n->b);
        ctx->line = n->line;
        return binary(ctx, n->op, a, b);
    }
    case JINJA_NODE_AND: {
        jinja_value a = eval(ctx, n->a);
        return jinja_truthy(a) ? eval(ctx, n->b) : a;
    }
    case JINJA_NODE_OR: {
        jinja_value a = eval(ctx, n->a);
        return jinja_truthy(a) ? a : eval(ctx, n->b);
    }
    case JINJA_NODE_COMPARE: {
        jinja_value left = eval(ctx, n->a);
        for (size_t i = 0; i < n->items.count; i++) {
            jinja_value right = eval(ctx, n->items.items[i]);
            ctx->line = n->line;
            if (!compare(ctx, n->compare_ops[i], left, right)) return jinja_bool(false);
            left = right;
        }
        return jinja_bool(true);
    }
    case JINJA_NODE_CONDITIONAL:
        if (jinja_truthy(eval(ctx, n->a))) return eval(ctx, n->b);
        if (n->c) return eval(ctx, n->c);
        return jinja_undefined("the inline if-expression evaluated to false and no else section was defined.");
    case JINJA_NODE_CONCAT: {
        /* Parts are converted first, then joined in the arena. */
        jinja_value *parts = jinja_arena_alloc(&ctx->arena, n->items.count * sizeof *parts);
        size_t total = 0;
        for (size_t i = 0; i < n->items.count; i++) {
            parts[i] = jinja_to_str(ctx, eval(ctx, n->items.items[i]));
            total += parts[i].as.string.length;
        }
        char *s = jinja_arena_alloc(&ctx->arena, total + 1);
        size_t at = 0;
        for (size_t i = 0; i < n->items.count; i++) {
            memcpy(s + at, parts[i].as.string.data, parts[i].as.string.length);
            at += parts[i].as.string.length;
        }
        return jinja_string(s, total);
    }
    default: jinja_runtime_error(ctx, "internal: statement node in an expression");
    }
}

/* ---- statements ------------------------------------------------------------------------------------------- */

/* Binds a for/set target: one name, or a tuple of names unpacked from the value. */
static void bind_target(jinja_render_context *ctx, const jinja_node *target, jinja_value value) {
    if (target->kind == JINJA_NODE_NAME) {
        assign(ctx, target->name, value);
        return;
    }
    jinja_list *items = jinja_iterate(ctx, value);
    if (items->count != target->items.count)
        jinja_runtime_error(ctx, items->count > target->items.count ? "too many values to unpack (expected %zu)"
                                                                     : "not enough values to unpack (expected %zu)",
                            target->items.count);
    for (size_t i = 0; i < items->count; i++) assign(ctx, target->items.items[i]->name, items->items[i]);
}

static void exec_set(jinja_render_context *ctx, const jinja_node *target, jinja_value value) {
    if (target->kind == JINJA_NODE_GETATTR) {
        jinja_value ns = lookup(ctx, target->a->name);
        if (ns.kind != JINJA_NAMESPACE) jinja_runtime_error(ctx, "cannot assign attribute on non-namespace object");
        jinja_dict_set(ctx, ns.as.dict, jinja_cstring(target->name), value);
        return;
    }
    bind_target(ctx, target, value);
}

static flow exec_for(jinja_render_context *ctx, const jinja_node *n) {
    jinja_value iterable = eval(ctx, n->a);
    ctx->line = n->line;
    jinja_list *items = jinja_iterate(ctx, iterable);
    jinja_frame *outer = ctx->frame;
    if (n->b) {
        /* The inline filter runs first, so loop.length and loop.last count the items that pass. */
        jinja_list *kept = jinja_new_list(ctx, JINJA_LIST, 0).as.list;
        jinja_frame *frame = push_frame(ctx, outer);
        for (size_t i = 0; i < items->count; i++) {
            frame->vars.count = 0;
            ctx->frame = frame;
            bind_target(ctx, n->target, items->items[i]);
            if (jinja_truthy(eval(ctx, n->b))) jinja_list_push(ctx, kept, items->items[i]);
            ctx->frame = outer;
        }
        items = kept;
    }
    jinja_loop *loop = jinja_arena_alloc(&ctx->arena, sizeof *loop);
    loop->items = items;
    jinja_frame *frame = NULL;
    for (size_t i = 0; i < items->count; i++) {
        jinja_count_steps(ctx, 1);
        loop->index0 = i;
        /* Each iteration starts with an empty scope; the last one's memory is reused unless a macro kept it. */
        if (!frame || frame->captured)
            frame = push_frame(ctx, outer);
        else
            frame->vars.count = 0;
        ctx->frame = frame;
        assign(ctx, "loop", (jinja_value){.kind = JINJA_LOOP, .as.loop = loop});
        ctx->line = n->line;
        bind_target(ctx, n->target, items->items[i]);
        flow f = exec_body(ctx, &n->body);
        ctx->frame = outer;
        if (f == FLOW_BREAK) break;
    }
    if (items->count == 0 && n->else_body.count) {
        ctx->frame = push_frame(ctx, outer);
        exec_body(ctx, &n->else_body);
        ctx->frame = outer;
    }
    return FLOW_NORMAL;
}

/* A macro or caller defined now keeps the current scopes alive. */
static void capture_frames(jinja_render_context *ctx) {
    for (jinja_frame *f = ctx->frame; f && !f->captured; f = f->parent) f->captured = true;
}

static jinja_value apply_filter_chain(jinja_render_context *ctx, const jinja_node_list *filters, jinja_value v) {
    for (size_t i = 0; i < filters->count; i++) v = eval_filter(ctx, filters->items[i], v);
    return v;
}

/* A block set's or filter block's body: its own scope (its sets stay inside), its output captured. */
static jinja_value exec_scoped_capture(jinja_render_context *ctx, const jinja_node_list *body) {
    jinja_frame *outer = ctx->frame;
    ctx->frame = push_frame(ctx, outer);
    text_builder *saved = capture_begin(ctx);
    exec_body(ctx, body);
    jinja_value text = capture_end(ctx, saved);
    ctx->frame = outer;
    return text;
}

static flow exec(jinja_render_context *ctx, const jinja_node *n) {
    jinja_count_steps(ctx, 1);
    ctx->line = n->line;
    switch (n->kind) {
    case JINJA_NODE_TEXT:
        text_builder_append(ctx->out, n->literal.as.string.data, n->literal.as.string.length);
        check_output(ctx);
        return FLOW_NORMAL;
    case JINJA_NODE_OUTPUT: {
        jinja_value v = eval(ctx, n->a);
        jinja_write_str(ctx, ctx->out, v);
        check_output(ctx);
        return FLOW_NORMAL;
    }
    case JINJA_NODE_IF:
        return exec_body(ctx, jinja_truthy(eval(ctx, n->a)) ? &n->body : &n->else_body);
    case JINJA_NODE_FOR: return exec_for(ctx, n);
    case JINJA_NODE_SET: {
        jinja_value v = eval(ctx, n->a);
        ctx->line = n->line;
        exec_set(ctx, n->target, v);
        return FLOW_NORMAL;
    }
    case JINJA_NODE_SET_BLOCK: {
        jinja_value v = apply_filter_chain(ctx, &n->filters, exec_scoped_capture(ctx, &n->body));
        ctx->line = n->line;
        exec_set(ctx, n->target, v);
        return FLOW_NORMAL;
    }
    case JINJA_NODE_FILTER_BLOCK: {
        jinja_value v = apply_filter_chain(ctx, &n->filters, exec_scoped_capture(ctx, &n->body));
        jinja_write_str(ctx, ctx->out, v);
        check_output(ctx);
        return FLOW_NORMAL;
    }
    case JINJA_NODE_MACRO: {
        jinja_macro *macro = jinja_arena_alloc(&ctx->arena, sizeof *macro);
        macro->node = n;
        macro->closure = ctx->frame;
        capture_frames(ctx);
        assign(ctx, n->name, (jinja_value){.kind = JINJA_MACRO, .as.macro = macro});
        return FLOW_NORMAL;
    }
    case JINJA_NODE_CALL_BLOCK: {
        jinja_macro *caller = jinja_arena_alloc(&ctx->arena, sizeof *caller);
        caller->node = n;
        caller->closure = ctx->frame;
        capture_frames(ctx);
        jinja_value v = eval_call(ctx, n->a, (jinja_value){.kind = JINJA_MACRO, .as.macro = caller});
        jinja_write_str(ctx, ctx->out, v);
        check_output(ctx);
        return FLOW_NORMAL;
    }
    case JINJA_NODE_BREAK: return FLOW_BREAK;
    case JINJA_NODE_CONTINUE: return FLOW_CONTINUE;
    default: jinja_runtime_error(ctx, "internal: expression node as a statement");
    }
}

static flow exec_body(jinja_render_context *ctx, const jinja_node_list *body) {
    for (size_t i = 0; i < body->count; i++) {
        flow f = exec(ctx, body->items[i]);
        if (f != FLOW_NORMAL) return f;
    }
    return FLOW_NORMAL;
}

/* ---- entry point ------------------------------------------------------------------------------------------- */

static void add_function(jinja_render_context *ctx, const char *name, jinja_function function) {
    jinja_dict_set(ctx, ctx->globals, jinja_cstring(name), (jinja_value){.kind = JINJA_FUNCTION, .as.function = (int)function});
}

kite_status jinja_render(const jinja_template *template_, const json_value *variables, char **out, size_t *out_length) {
    if (out) *out = NULL;
    if (out_length) *out_length = 0;
    if (!template_ || !out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "jinja_render: no template or output");
    if (variables && variables->type != JSON_TYPE_OBJECT)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "%s: the variables must be a JSON object, not %s",
                         template_->name, json_type_name(variables->type));
    jinja_render_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory", template_->name);
    text_builder *result = malloc(sizeof *result);
    if (!result) {
        free(ctx);
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory", template_->name);
    }
    *result = (text_builder){.limit = JINJA_MAX_OUTPUT_BYTES};
    ctx->template_ = template_;
    ctx->arena.limit = JINJA_MAX_ARENA_BYTES;
    ctx->arena.on_fail = &ctx->on_fail;
    ctx->out = ctx->result = result;
    if (setjmp(ctx->on_fail) != 0) {
        kite_status status = ctx->arena.status;
        for (int i = 0; i < ctx->n_captures; i++) text_builder_free(&ctx->captures[i]);
        text_builder_free(result);
        free(result);
        jinja_arena_free(&ctx->arena);
        free(ctx);
        return status;
    }
    ctx->globals = jinja_new_dict(ctx, JINJA_DICT).as.dict;
    add_function(ctx, "raise_exception", JINJA_FUNCTION_RAISE_EXCEPTION);
    add_function(ctx, "strftime_now", JINJA_FUNCTION_STRFTIME_NOW);
    add_function(ctx, "namespace", JINJA_FUNCTION_NAMESPACE);
    add_function(ctx, "range", JINJA_FUNCTION_RANGE);
    add_function(ctx, "dict", JINJA_FUNCTION_DICT);
    if (variables)
        for (size_t i = 0; i < variables->length; i++) {
            const json_member *m = &variables->as.members[i];
            jinja_dict_set(ctx, ctx->globals, jinja_string(m->key, m->key_length), jinja_from_json(ctx, &m->value, 0));
        }
    ctx->frame = push_frame(ctx, NULL);
    exec_body(ctx, &template_->body);
    size_t length = 0;
    char *text = text_builder_take(result, &length);
    free(result);
    jinja_arena_free(&ctx->arena);
    free(ctx);
    if (!text) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory", template_->name);
    *out = text;
    if (out_length) *out_length = length;
    return KITE_OK;
}

#include "chat/python_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void python_json_string(text_builder *b, const char *text, size_t length) {
    text_builder_putc(b, '"');
    size_t run = 0; /* bytes copied as they are, in one append */
    for (size_t i = 0; i < length; i++) {
        const unsigned char c = (unsigned char)text[i];
        const char *named = NULL;
        switch (c) {
        case '"': named = "\\\""; break;
        case '\\': named = "\\\\"; break;
        case '\n': named = "\\n"; break;
        case '\r': named = "\\r"; break;
        case '\t': named = "\\t"; break;
        case '\b': named = "\\b"; break;
        case '\f': named = "\\f"; break;
        default: break;
        }
        if (!named && c >= 0x20) continue;
        text_builder_append(b, text + run, i - run);
        run = i + 1;
        if (named)
            text_builder_puts(b, named);
        else
            text_builder_printf(b, "\\u%04x", c);
    }
    text_builder_append(b, text + run, length - run);
    text_builder_putc(b, '"');
}

void python_json_int(text_builder *b, int64_t value) { text_builder_printf(b, "%lld", (long long)value); }

void python_json_float(text_builder *b, double value) {
    if (isnan(value)) {
        text_builder_puts(b, "NaN");
        return;
    }
    if (isinf(value)) {
        text_builder_puts(b, value > 0 ? "Infinity" : "-Infinity");
        return;
    }
    /* The shortest digits that read back as the same double, as Python's repr finds them. */
    char digits[40];
    int precision = 1;
    for (; precision <= 17; precision++) {
        snprintf(digits, sizeof digits, "%.*e", precision - 1, value);
        if (strtod(digits, NULL) == value) break;
    }
    /* digits is "[-]D.DDDe[+-]XX": split mantissa digits and the decimal exponent. */
    const bool negative = digits[0] == '-';
    const char *p = digits + (negative ? 1 : 0);
    char mantissa[20];
    int n = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') mantissa[n++] = *p;
    while (n > 1 && mantissa[n - 1] == '0') n--;
    mantissa[n] = '\0';
    const int exponent = atoi(p + 1); /* value = 0.mantissa... x 10^(exponent + 1) */
    if (negative) text_builder_putc(b, '-');
    /* repr: scientific when the exponent is below -4 or at least 16, otherwise positional with a ".0" at least. */
    if (exponent < -4 || exponent >= 16) {
        text_builder_putc(b, mantissa[0]);
        if (n > 1) {
            text_builder_putc(b, '.');
            text_builder_append(b, mantissa + 1, (size_t)(n - 1));
        }
        text_builder_printf(b, "e%c%02d", exponent < 0 ? '-' : '+', abs(exponent));
    } else if (exponent < 0) {
        text_builder_puts(b, "0.");
        for (int i = 0; i < -exponent - 1; i++) text_builder_putc(b, '0');
        text_builder_append(b, mantissa, (size_t)n);
    } else {
        const int whole = exponent + 1; /* digits before the point */
        for (int i = 0; i < whole; i++) text_builder_putc(b, i < n ? mantissa[i] : '0');
        text_builder_putc(b, '.');
        if (n > whole)
            text_builder_append(b, mantissa + whole, (size_t)(n - whole));
        else
            text_builder_putc(b, '0');
    }
}

static void newline_and_indent(text_builder *b, int indent, int depth) {
    text_builder_putc(b, '\n');
    for (int i = 0; i < indent * depth; i++) text_builder_putc(b, ' ');
}

static void write_value(text_builder *b, const json_value *v, int indent, bool compact, int depth) {
    /* json.dumps with an indent ends items with "," (no space) and keys with ": ". */
    const char *item_separator = indent >= 0 || compact ? "," : ", ";
    const char *key_separator = compact ? ":" : ": ";
    switch (v->type) {
    case JSON_TYPE_NULL: text_builder_puts(b, "null"); return;
    case JSON_TYPE_FALSE: text_builder_puts(b, "false"); return;
    case JSON_TYPE_TRUE: text_builder_puts(b, "true"); return;
    case JSON_TYPE_NUMBER:
        if (v->is_integer)
            python_json_int(b, v->as.num.integer);
        else if (v->is_big_integer)
            text_builder_puts(b, v->as.num.digits);
        else
            python_json_float(b, v->as.num.number);
        return;
    case JSON_TYPE_STRING: python_json_string(b, v->as.string, v->length); return;
    case JSON_TYPE_ARRAY:
        if (v->length == 0) {
            text_builder_puts(b, "[]");
            return;
        }
        text_builder_putc(b, '[');
        for (size_t i = 0; i < v->length; i++) {
            if (i) text_builder_puts(b, item_separator);
            if (indent >= 0) newline_and_indent(b, indent, depth + 1);
            write_value(b, &v->as.items[i], indent, compact, depth + 1);
        }
        if (indent >= 0) newline_and_indent(b, indent, depth);
        text_builder_putc(b, ']');
        return;
    case JSON_TYPE_OBJECT:
        if (v->length == 0) {
            text_builder_puts(b, "{}");
            return;
        }
        text_builder_putc(b, '{');
        for (size_t i = 0; i < v->length; i++) {
            if (i) text_builder_puts(b, item_separator);
            if (indent >= 0) newline_and_indent(b, indent, depth + 1);
            python_json_string(b, v->as.members[i].key, v->as.members[i].key_length);
            text_builder_puts(b, key_separator);
            write_value(b, &v->as.members[i].value, indent, compact, depth + 1);
        }
        if (indent >= 0) newline_and_indent(b, indent, depth);
        text_builder_putc(b, '}');
        return;
    }
}

void python_json_value(text_builder *b, const json_value *value, int indent, bool compact) {
    write_value(b, value, indent, compact, 0);
}

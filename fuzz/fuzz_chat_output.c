/* libFuzzer: generated text split into reasoning, content and tool calls. The first two bytes pick the parser's
 * options and how the text is cut, the rest is the text. Fed whole, byte by byte and in pieces, the parser must
 * give the same concatenated deltas, the same calls (ids included) and the same final result, and a delta may
 * not split a UTF-8 character of a valid text. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat/chat_output.h"
#include "util/text_builder.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct collected {
    text_builder reasoning;
    text_builder content;
    text_builder calls; /* id, name and arguments of every call, NUL-separated */
    bool split_character;
} collected;

static bool is_valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (len == 0 || i + len > n) return false;
        for (size_t k = 1; k < len; k++)
            if (((unsigned char)s[i + k] & 0xC0) != 0x80) return false;
        i += len;
    }
    return true;
}

static void collect(collected *c, const chat_output_delta *d, bool text_is_utf8) {
    text_builder_append(&c->reasoning, d->reasoning, d->reasoning_length);
    text_builder_append(&c->content, d->content, d->content_length);
    if (text_is_utf8 && (!is_valid_utf8(d->reasoning, d->reasoning_length) ||
                         !is_valid_utf8(d->content, d->content_length)))
        c->split_character = true;
    for (size_t i = 0; i < d->n_calls; i++) {
        const chat_tool_call *call = &d->calls[i];
        text_builder_append(&c->calls, call->id, strlen(call->id) + 1);
        text_builder_append(&c->calls, call->name, call->name_length + 1);
        text_builder_append(&c->calls, call->arguments, call->arguments_length + 1);
    }
}

static bool same(const text_builder *a, const text_builder *b) {
    return a->length == b->length && (a->length == 0 || memcmp(a->data, b->data, a->length) == 0);
}

static bool same_as_text(const text_builder *a, const char *text, size_t length) {
    return a->length == length && (length == 0 || memcmp(a->data, text, length) == 0);
}

/* Feeds text in pieces: `step` 0 whole, 1 byte by byte, otherwise lengths drawn from `seed` below `step`. */
static void run(const chat_output_params *params, const char *text, size_t length, unsigned step, uint32_t seed,
                collected *c) {
    memset(c, 0, sizeof *c);
    chat_output_parser *p = NULL;
    if (chat_output_create(params, &p) != KITE_OK) __builtin_trap();
    const bool text_is_utf8 = is_valid_utf8(text, length);
    chat_output_delta d;
    for (size_t at = 0; at < length;) {
        size_t n = length - at;
        if (step == 1) {
            n = 1;
        } else if (step > 1) {
            seed = seed * 1103515245u + 12345u;
            const size_t drawn = (seed >> 16) % step; /* 0 too: empty pieces are legal */
            if (drawn < n) n = drawn;
        }
        if (chat_output_feed(p, text + at, n, &d) != KITE_OK) __builtin_trap();
        collect(c, &d, text_is_utf8);
        at += n;
    }
    if (chat_output_finish(p, &d) != KITE_OK) __builtin_trap();
    collect(c, &d, text_is_utf8);
    chat_output_delta r;
    chat_output_result(p, &r);
    if (!same_as_text(&c->reasoning, r.reasoning, r.reasoning_length) ||
        !same_as_text(&c->content, r.content, r.content_length))
        __builtin_trap();
    text_builder all_calls = {0};
    for (size_t i = 0; i < r.n_calls; i++) {
        text_builder_append(&all_calls, r.calls[i].id, strlen(r.calls[i].id) + 1);
        text_builder_append(&all_calls, r.calls[i].name, r.calls[i].name_length + 1);
        text_builder_append(&all_calls, r.calls[i].arguments, r.calls[i].arguments_length + 1);
    }
    if (all_calls.failed || c->reasoning.failed || c->content.failed || c->calls.failed) abort(); /* out of memory */
    if (!same(&all_calls, &c->calls)) __builtin_trap();
    text_builder_free(&all_calls);
    chat_output_free(p);
}

static void free_collected(collected *c) {
    text_builder_free(&c->reasoning);
    text_builder_free(&c->content);
    text_builder_free(&c->calls);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const uint8_t options = data[0];
    chat_output_params params = {
        .reasoning = options & 1,
        .starts_in_reasoning = (options & 3) == 3,
        .tools = (options & 4) != 0,
        /* Small limits reach T5; a large one leaves every call to be read. */
        .max_call_bytes = (options & 8) ? (size_t)(options >> 4) * 4 + 1 : 1u << 20,
        .id_seed = data[1],
    };
    const char *text = (const char *)data + 2;
    const size_t length = size - 2;

    collected whole;
    run(&params, text, length, 0, 0, &whole);
    if (whole.split_character) __builtin_trap();
    collected other;
    const unsigned steps[] = {1, 3, 9, 40};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        if (steps[i] == 1 && length > 4096) continue;
        run(&params, text, length, steps[i], (uint32_t)data[1] * 2654435761u + (uint32_t)i, &other);
        if (!same(&whole.reasoning, &other.reasoning) || !same(&whole.content, &other.content) ||
            !same(&whole.calls, &other.calls) || other.split_character)
            __builtin_trap();
        free_collected(&other);
    }
    free_collected(&whole);
    return 0;
}

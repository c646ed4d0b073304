#include "serve_stream.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/json.h"

/* Events longer than this are refused rather than buffered without bound: a completion chunk is a few hundred
 * bytes, so a longer one means the body is not what the generator expects. */
#define SERVE_STREAM_MAX_EVENT (1u << 20)

void serve_stream_free(serve_stream *s) {
    text_builder_free(&s->line);
    text_builder_free(&s->data);
    text_builder_free(&s->text);
    free(s->chunk_times);
    *s = (serve_stream){0};
}

static bool stream_fail(serve_stream *s, const char *format, ...) __attribute__((format(printf, 2, 3)));
static bool stream_fail(serve_stream *s, const char *format, ...) {
    if (s->failed) return false;
    va_list args;
    va_start(args, format);
    vsnprintf(s->error, sizeof s->error, format, args);
    va_end(args);
    s->failed = true;
    return false;
}

static bool stream_add_chunk_time(serve_stream *s, double now) {
    if (s->n_chunk_times == s->chunk_times_capacity) {
        size_t capacity = s->chunk_times_capacity ? 2 * s->chunk_times_capacity : 256;
        double *grown = realloc(s->chunk_times, capacity * sizeof *grown);
        if (!grown) return stream_fail(s, "out of memory recording chunk times");
        s->chunk_times = grown;
        s->chunk_times_capacity = capacity;
    }
    s->chunk_times[s->n_chunk_times++] = now;
    return true;
}

/* The error event's message, for the failure line: {"error":{"message":...}} or {"error":"..."}. */
static const char *error_message(const json_value *error) {
    if (json_is_string(error)) return error->as.string;
    const json_value *message = json_object_member(error, "message");
    return json_is_string(message) ? message->as.string : "(no message)";
}

static bool stream_read_usage(serve_stream *s, const json_value *usage) {
    const json_value *prompt = json_object_member(usage, "prompt_tokens");
    const json_value *completion = json_object_member(usage, "completion_tokens");
    int64_t p = 0, c = 0;
    if (!json_get_int64(prompt, &p) || !json_get_int64(completion, &c) || p < 0 || c < 0)
        return stream_fail(s, "a chunk's usage has no integer prompt_tokens and completion_tokens");
    if (s->has_usage) return stream_fail(s, "two chunks carry a usage");
    s->has_usage = true;
    s->prompt_tokens = p;
    s->completion_tokens = c;
    return true;
}

static bool stream_read_choice(serve_stream *s, const json_value *choice, double now) {
    if (!json_is_object(choice)) return stream_fail(s, "a chunk's choice is not an object");
    const json_value *index = json_object_member(choice, "index");
    int64_t i = 0;
    if (index && (!json_get_int64(index, &i) || i != 0))
        return stream_fail(s, "a chunk's choice has index other than 0 (the generator asks for one completion)");
    const json_value *text = json_object_member(choice, "text");
    if (!json_is_string(text)) return stream_fail(s, "a chunk's choice has no string \"text\"");
    text_builder_append(&s->text, text->as.string, text->length);
    if (s->text.failed) return stream_fail(s, "out of memory holding the completion's text");
    const json_value *finish = json_object_member(choice, "finish_reason");
    /* As vLLM's client: every chunk with a choice is a token's arrival (its text may be empty, a character still
     * incomplete), but for a closing chunk that carries only the finish reason, which some servers send apart. */
    if ((text->length > 0 || !json_is_string(finish)) && !stream_add_chunk_time(s, now)) return false;
    if (json_is_string(finish)) {
        if (s->finish_reason[0]) return stream_fail(s, "two chunks carry a finish_reason");
        if (finish->length == 0 || finish->length >= sizeof s->finish_reason)
            return stream_fail(s, "a finish_reason of %zu bytes", finish->length);
        memcpy(s->finish_reason, finish->as.string, finish->length + 1);
    } else if (finish && !json_is_null(finish)) {
        return stream_fail(s, "a chunk's finish_reason is neither a string nor null");
    }
    return true;
}

static bool stream_read_event(serve_stream *s, const char *data, size_t length, double now) {
    if (s->done) return stream_fail(s, "an event after data: [DONE]");
    if (length == 6 && memcmp(data, "[DONE]", 6) == 0) {
        s->done = true;
        return true;
    }
    json_error error;
    json_document *document = json_parse(data, length, &error);
    if (!document)
        return stream_fail(s, "an event is not JSON (%s at byte %zu): %.120s", error.message, error.offset, data);
    const json_value *root = json_root(document);
    bool ok = true;
    const json_value *server_error = json_object_member(root, "error");
    const json_value *choices = json_object_member(root, "choices");
    const json_value *usage = json_object_member(root, "usage");
    if (!json_is_object(root)) {
        ok = stream_fail(s, "an event is not a JSON object: %.120s", data);
    } else if (server_error) {
        ok = stream_fail(s, "the server sent an error event: %.300s", error_message(server_error));
    } else if (!json_is_array(choices)) {
        ok = stream_fail(s, "a chunk has no \"choices\" array: %.120s", data);
    } else if (choices->length > 1) {
        ok = stream_fail(s, "a chunk has %zu choices (the generator asks for one)", choices->length);
    } else {
        if (choices->length == 1) ok = stream_read_choice(s, &choices->as.items[0], now);
        if (ok && usage && !json_is_null(usage)) ok = stream_read_usage(s, usage);
    }
    json_free(document);
    return ok;
}

/* One line of the body, without its end: a field, a comment (':'), or the blank line that ends an event. */
static bool stream_read_line(serve_stream *s, const char *line, size_t length, double now) {
    if (length == 0) {
        if (!s->in_event) return true;
        s->in_event = false;
        const char *data = s->data.data ? s->data.data : "";
        bool ok = stream_read_event(s, data, s->data.length, now);
        text_builder_clear(&s->data);
        return ok;
    }
    if (line[0] == ':') return true;
    const char *colon = memchr(line, ':', length);
    size_t name_length = colon ? (size_t)(colon - line) : length;
    if (name_length != 4 || memcmp(line, "data", 4) != 0) return true; /* event, id, retry: nothing to read */
    const char *value = colon ? colon + 1 : line + length;
    size_t value_length = (size_t)(line + length - value);
    if (value_length > 0 && value[0] == ' ') {
        value++;
        value_length--;
    }
    if (s->in_event) text_builder_putc(&s->data, '\n');
    text_builder_append(&s->data, value, value_length);
    s->in_event = true;
    if (s->data.failed) return stream_fail(s, "out of memory holding an event");
    if (s->data.length > SERVE_STREAM_MAX_EVENT)
        return stream_fail(s, "an event longer than %u bytes", SERVE_STREAM_MAX_EVENT);
    return true;
}

bool serve_stream_feed(serve_stream *s, const char *bytes, size_t length, double now) {
    if (s->failed) return false;
    size_t start = 0;
    for (size_t i = 0; i < length; i++) {
        const char c = bytes[i];
        if (c != '\n' && c != '\r') {
            s->after_cr = false;
            continue;
        }
        const bool skip = c == '\n' && s->after_cr && i == start && s->line.length == 0;
        s->after_cr = c == '\r';
        if (skip) {
            start = i + 1;
            continue;
        }
        text_builder_append(&s->line, bytes + start, i - start);
        if (s->line.failed) return stream_fail(s, "out of memory holding a line");
        bool ok = stream_read_line(s, s->line.data ? s->line.data : "", s->line.length, now);
        text_builder_clear(&s->line);
        if (!ok) return false;
        start = i + 1;
    }
    text_builder_append(&s->line, bytes + start, length - start);
    if (s->line.failed) return stream_fail(s, "out of memory holding a line");
    if (s->line.length > SERVE_STREAM_MAX_EVENT)
        return stream_fail(s, "a line longer than %u bytes", SERVE_STREAM_MAX_EVENT);
    return true;
}

bool serve_stream_finish(serve_stream *s) {
    if (s->failed) return false;
    if (s->line.length > 0 || s->in_event) return stream_fail(s, "the body ended inside an event");
    if (!s->done) return stream_fail(s, "the body ended before data: [DONE]");
    return true;
}

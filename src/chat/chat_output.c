#include "chat/chat_output.h"

#include <stdlib.h>
#include <string.h>

#include "chat/python_json.h"
#include "util/error.h"
#include "util/json.h"
#include "util/text_builder.h"

static const char THINK_START[] = "<think>";
static const char THINK_END[] = "</think>";
static const char CALL_START[] = "<tool_call>";
static const char CALL_END[] = "</tool_call>";
#define TAG_LENGTH(tag) (sizeof(tag) - 1)

/* Where the text stands; each state names what the bytes at the front of `pending` are. */
typedef enum parse_state {
    PARSE_STATE_START,      /* reasoning on, nothing decided: a leading <think> may come (R2) */
    PARSE_STATE_REASONING,  /* reasoning until </think> (R3) */
    PARSE_STATE_SEPARATOR,  /* right after </think>: params.separator is dropped if it comes (R5) */
    PARSE_STATE_CONTENT,    /* content; with tools, until the first <tool_call> (T1) */
    PARSE_STATE_CALL,       /* inside a tool call's body, held until </tool_call> or the end (T1, T5) */
    PARSE_STATE_AFTER_CALL, /* after a valid call: text dropped until the next <tool_call> (T3) */
    PARSE_STATE_PLAIN,      /* after a malformed call: content to the end, no more tags (T4) */
} parse_state;

/* One of the two texts a response carries. A delta holds back the bytes of a UTF-8 sequence that is not
 * complete yet (`carry`), so no delta ends inside a character. */
typedef struct output_stream {
    text_builder delta; /* what the current feed adds */
    text_builder all;   /* everything emitted so far */
    char carry[4];
    size_t n_carry;
} output_stream;

struct chat_output_parser {
    chat_output_params params;
    parse_state state;
    text_builder pending; /* bytes received and not yet decided */
    size_t scan_offset;   /* PARSE_STATE_CALL: the body's first bytes known not to begin </tool_call> */
    output_stream reasoning;
    output_stream content;
    chat_tool_call *calls;
    size_t n_calls;
    size_t calls_capacity;
    size_t first_delta_call; /* calls[first_delta_call..n_calls) are the current feed's */
    uint64_t id_state;
    bool finished;
    bool broken; /* an allocation failed: the texts are incomplete, so nothing more is accepted */
};

/* The bytes at the end of text[0..length) that start a UTF-8 sequence still missing bytes (0..3). A sequence
 * that can never complete (a stray continuation byte, a byte that leads nothing) is not held. */
static size_t utf8_incomplete_tail(const char *text, size_t length) {
    for (size_t back = 1; back <= 3 && back <= length; back++) {
        const unsigned char c = (unsigned char)text[length - back];
        if ((c & 0xC0) == 0x80) continue; /* a continuation byte: look further back for its lead */
        size_t needed = 0;
        if ((c & 0xE0) == 0xC0)
            needed = 2;
        else if ((c & 0xF0) == 0xE0)
            needed = 3;
        else if ((c & 0xF8) == 0xF0)
            needed = 4;
        return needed > back ? back : 0;
    }
    return 0;
}

static void stream_emit(output_stream *s, const char *text, size_t length) {
    if (length == 0) return;
    text_builder_append(&s->delta, s->carry, s->n_carry);
    s->n_carry = 0;
    text_builder_append(&s->delta, text, length);
    if (s->delta.failed) return;
    const size_t tail = utf8_incomplete_tail(s->delta.data, s->delta.length);
    memcpy(s->carry, s->delta.data + s->delta.length - tail, tail);
    s->n_carry = tail;
    s->delta.length -= tail;
    s->delta.data[s->delta.length] = '\0';
}

/* The stream stops here (reasoning at </think>, content at <tool_call>, everything at the end): a sequence
 * still held can no longer complete and passes through as it is. */
static void stream_flush(output_stream *s) {
    text_builder_append(&s->delta, s->carry, s->n_carry);
    s->n_carry = 0;
}

/* The first occurrence of tag in text[from..length), or length when there is none. */
static size_t find_tag(const char *text, size_t length, size_t from, const char *tag, size_t tag_length) {
    for (size_t i = from; i + tag_length <= length; i++) {
        const char *hit = memchr(text + i, tag[0], length - tag_length + 1 - i);
        if (!hit) break;
        i = (size_t)(hit - text);
        if (memcmp(hit, tag, tag_length) == 0) return i;
    }
    return length;
}

/* The longest suffix of text[0..length) that is a proper prefix of tag: bytes that may still become it. */
static size_t partial_tag_length(const char *text, size_t length, const char *tag, size_t tag_length) {
    size_t k = tag_length - 1 < length ? tag_length - 1 : length;
    for (; k > 0; k--)
        if (memcmp(text + length - k, tag, k) == 0) return k;
    return 0;
}

static uint64_t splitmix64_next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* "chatcmpl-tool-" + uuid4().hex, as vLLM's make_tool_call_id, from the parser's seeded generator. */
static char *make_call_id(uint64_t *state) {
    unsigned char bytes[16];
    for (int half = 0; half < 2; half++) {
        uint64_t r = splitmix64_next(state);
        for (int i = 0; i < 8; i++) bytes[half * 8 + i] = (unsigned char)(r >> (8 * i));
    }
    bytes[6] = (unsigned char)((bytes[6] & 0x0F) | 0x40); /* version 4 */
    bytes[8] = (unsigned char)((bytes[8] & 0x3F) | 0x80); /* RFC 4122 variant */
    static const char prefix[] = "chatcmpl-tool-";
    static const char hex[] = "0123456789abcdef";
    char *id = malloc(sizeof prefix + 32);
    if (!id) return NULL;
    memcpy(id, prefix, sizeof prefix - 1);
    char *p = id + sizeof prefix - 1;
    for (int i = 0; i < 16; i++) {
        *p++ = hex[bytes[i] >> 4];
        *p++ = hex[bytes[i] & 0x0F];
    }
    *p = '\0';
    return id;
}

static void free_call(chat_tool_call *call) {
    free(call->id);
    free(call->name);
    free(call->arguments);
}

/* Whether a call may name name[0..length) (T6). */
static bool name_allowed(const chat_output_params *params, const char *name, size_t length) {
    if (!params->call_names) return true;
    for (size_t i = 0; i < params->n_call_names; i++)
        if (strlen(params->call_names[i]) == length && memcmp(params->call_names[i], name, length) == 0) return true;
    return false;
}

/* Reads a call's body (T2, T6). *valid is false for a malformed body; the status is not OK only when memory ran
 * out. */
static kite_status parse_call(chat_output_parser *p, const char *body, size_t length, bool *valid) {
    *valid = false;
    /* json.loads keeps the last value of a repeated key (T2), so this body is read that way, not refused. */
    const json_parse_options options = {.duplicate_keys = JSON_DUPLICATE_KEYS_LAST_WINS};
    json_error error;
    json_document *doc = json_parse_with_options(length ? body : "", length, &options, &error);
    if (!doc) {
        if (strcmp(error.message, "out of memory") == 0)
            return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "chat output: out of memory reading a tool call");
        return KITE_OK;
    }
    const json_value *root = json_root(doc);
    const json_value *name = json_is_object(root) ? json_object_member(root, "name") : NULL;
    const json_value *arguments = json_is_object(root) ? json_object_member(root, "arguments") : NULL;
    if (!json_is_string(name) || !arguments || !name_allowed(&p->params, name->as.string, name->length)) {
        json_free(doc);
        return KITE_OK;
    }
    if (p->n_calls == p->calls_capacity) {
        const size_t capacity = p->calls_capacity ? 2 * p->calls_capacity : 4;
        chat_tool_call *grown = realloc(p->calls, capacity * sizeof *grown);
        if (!grown) {
            json_free(doc);
            return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "chat output: out of memory for %zu tool calls", capacity);
        }
        p->calls = grown;
        p->calls_capacity = capacity;
    }
    chat_tool_call call = {0};
    text_builder b = {0};
    python_json_value(&b, arguments, -1, false);
    call.arguments = text_builder_take(&b, &call.arguments_length);
    call.name = malloc(name->length + 1);
    if (call.name) {
        memcpy(call.name, name->as.string, name->length);
        call.name[name->length] = '\0';
        call.name_length = name->length;
    }
    call.id = make_call_id(&p->id_state);
    json_free(doc);
    if (!call.arguments || !call.name || !call.id) {
        free_call(&call);
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "chat output: out of memory for a tool call");
    }
    p->calls[p->n_calls++] = call;
    *valid = true;
    return KITE_OK;
}

/* Consumes the front of `pending` as far as it is decided (everything when at_end), emitting into the
 * deltas; what stays is the undecided tail. */
static kite_status drain(chat_output_parser *p, bool at_end) {
    const char *text = p->pending.data ? p->pending.data : ""; /* NULL until the first byte arrives */
    const size_t length = p->pending.length;
    size_t pos = 0;
    for (;;) {
        const char *rest = text + pos;
        const size_t n = length - pos;
        switch (p->state) {
        case PARSE_STATE_START: {
            const size_t k = n < TAG_LENGTH(THINK_START) ? n : TAG_LENGTH(THINK_START);
            if (k > 0 && memcmp(rest, THINK_START, k) == 0 && k < TAG_LENGTH(THINK_START) && !at_end) goto done;
            if (n == 0 && !at_end) goto done;
            if (k == TAG_LENGTH(THINK_START) && memcmp(rest, THINK_START, k) == 0) {
                pos += k;
                p->state = PARSE_STATE_REASONING;
            } else {
                p->state = p->params.starts_in_reasoning ? PARSE_STATE_REASONING : PARSE_STATE_CONTENT;
            }
            break;
        }
        case PARSE_STATE_REASONING: {
            const size_t at = find_tag(rest, n, 0, THINK_END, TAG_LENGTH(THINK_END));
            if (at < n) {
                stream_emit(&p->reasoning, rest, at);
                stream_flush(&p->reasoning);
                pos += at + TAG_LENGTH(THINK_END);
                p->state = p->params.separator_length > 0 ? PARSE_STATE_SEPARATOR : PARSE_STATE_CONTENT;
                break;
            }
            const size_t keep = at_end ? 0 : partial_tag_length(rest, n, THINK_END, TAG_LENGTH(THINK_END));
            stream_emit(&p->reasoning, rest, n - keep);
            pos += n - keep;
            goto done;
        }
        case PARSE_STATE_SEPARATOR: {
            const size_t want = p->params.separator_length, k = n < want ? n : want;
            const bool matches = memcmp(rest, p->params.separator, k) == 0;
            if (matches && k < want && !at_end) goto done; /* a prefix of it so far */
            if (matches && k == want) pos += want;
            p->state = PARSE_STATE_CONTENT;
            break;
        }
        case PARSE_STATE_CONTENT: {
            if (!p->params.tools) {
                stream_emit(&p->content, rest, n);
                pos += n;
                goto done;
            }
            const size_t at = find_tag(rest, n, 0, CALL_START, TAG_LENGTH(CALL_START));
            if (at < n) {
                stream_emit(&p->content, rest, at);
                stream_flush(&p->content);
                pos += at + TAG_LENGTH(CALL_START);
                p->state = PARSE_STATE_CALL;
                p->scan_offset = 0;
                break;
            }
            const size_t keep = at_end ? 0 : partial_tag_length(rest, n, CALL_START, TAG_LENGTH(CALL_START));
            stream_emit(&p->content, rest, n - keep);
            pos += n - keep;
            goto done;
        }
        case PARSE_STATE_CALL: {
            const size_t at = find_tag(rest, n, p->scan_offset, CALL_END, TAG_LENGTH(CALL_END));
            const bool closed = at < n;
            /* Bytes that are surely body: all before the end tag, or all but a suffix that may begin it. */
            const size_t body = closed || at_end ? at : n - partial_tag_length(rest, n, CALL_END, TAG_LENGTH(CALL_END));
            if (body > p->params.max_call_bytes) {
                /* T5: too long to be held; the call is text from its tag on. */
                stream_emit(&p->content, CALL_START, TAG_LENGTH(CALL_START));
                p->state = PARSE_STATE_PLAIN;
                break;
            }
            if (!closed && !at_end) {
                p->scan_offset = body;
                goto done;
            }
            bool valid;
            KITE_TRY(parse_call(p, rest, body, &valid));
            if (valid) {
                p->state = PARSE_STATE_AFTER_CALL;
            } else {
                /* T4: the call and everything after it are content. */
                stream_emit(&p->content, CALL_START, TAG_LENGTH(CALL_START));
                stream_emit(&p->content, rest, body);
                if (closed) stream_emit(&p->content, CALL_END, TAG_LENGTH(CALL_END));
                p->state = PARSE_STATE_PLAIN;
            }
            pos += body + (closed ? TAG_LENGTH(CALL_END) : 0);
            break;
        }
        case PARSE_STATE_AFTER_CALL: {
            const size_t at = find_tag(rest, n, 0, CALL_START, TAG_LENGTH(CALL_START));
            if (at < n) {
                pos += at + TAG_LENGTH(CALL_START);
                p->state = PARSE_STATE_CALL;
                p->scan_offset = 0;
                break;
            }
            pos += n - (at_end ? 0 : partial_tag_length(rest, n, CALL_START, TAG_LENGTH(CALL_START)));
            goto done;
        }
        case PARSE_STATE_PLAIN:
            stream_emit(&p->content, rest, n);
            pos += n;
            goto done;
        }
    }
done:
    if (pos > 0) {
        memmove(p->pending.data, text + pos, length - pos);
        p->pending.length = length - pos;
        p->pending.data[p->pending.length] = '\0';
    }
    return KITE_OK;
}

static void delta_begin(chat_output_parser *p) {
    text_builder_clear(&p->reasoning.delta);
    text_builder_clear(&p->content.delta);
    p->first_delta_call = p->n_calls;
}

static kite_status delta_end(chat_output_parser *p, kite_status status, chat_output_delta *delta) {
    text_builder_append(&p->reasoning.all, p->reasoning.delta.data, p->reasoning.delta.length);
    text_builder_append(&p->content.all, p->content.delta.data, p->content.delta.length);
    if (status == KITE_OK && (p->pending.failed || p->reasoning.delta.failed || p->content.delta.failed ||
                              p->reasoning.all.failed || p->content.all.failed))
        status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "chat output: out of memory holding %zu bytes of text",
                           p->pending.length + p->content.all.length + p->reasoning.all.length);
    memset(delta, 0, sizeof *delta);
    delta->reasoning = "";
    delta->content = "";
    if (status != KITE_OK) {
        p->broken = true;
        return status;
    }
    if (p->reasoning.delta.data) {
        delta->reasoning = p->reasoning.delta.data;
        delta->reasoning_length = p->reasoning.delta.length;
    }
    if (p->content.delta.data) {
        delta->content = p->content.delta.data;
        delta->content_length = p->content.delta.length;
    }
    delta->n_calls = p->n_calls - p->first_delta_call;
    delta->calls = delta->n_calls ? p->calls + p->first_delta_call : NULL;
    return KITE_OK;
}

static kite_status check_usable(const chat_output_parser *p, const void *delta, const char *what) {
    if (!p || !delta) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "chat_output_%s: no parser or no delta", what);
    if (p->broken)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "chat_output_%s: the parser failed earlier (out of memory)",
                         what);
    if (p->finished)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "chat_output_%s: the generation was already finished", what);
    return KITE_OK;
}

kite_status chat_output_create(const chat_output_params *params, chat_output_parser **out) {
    if (!params || !out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "chat_output_create: no params or no out");
    *out = NULL;
    if (params->starts_in_reasoning && !params->reasoning)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "chat_output_create: starts_in_reasoning needs reasoning (the prompt opened <think>)");
    if (params->separator_length > 0 && (!params->reasoning || !params->separator))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "chat_output_create: a separator needs reasoning and its bytes (it follows </think>)");
    if (params->tools && params->max_call_bytes == 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "chat_output_create: tools needs max_call_bytes > 0 (the most an open call may hold)");
    chat_output_parser *p = calloc(1, sizeof *p);
    if (!p) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "chat_output_create: out of memory");
    p->params = *params;
    p->state = params->reasoning ? PARSE_STATE_START : PARSE_STATE_CONTENT;
    p->id_state = params->id_seed;
    *out = p;
    return KITE_OK;
}

kite_status chat_output_feed(chat_output_parser *p, const char *text, size_t length, chat_output_delta *delta) {
    KITE_TRY(check_usable(p, delta, "feed"));
    if (!text && length > 0) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "chat_output_feed: no text");
    delta_begin(p);
    text_builder_append(&p->pending, text, length);
    kite_status status = p->pending.failed ? KITE_OK : drain(p, false);
    return delta_end(p, status, delta);
}

kite_status chat_output_finish(chat_output_parser *p, chat_output_delta *delta) {
    KITE_TRY(check_usable(p, delta, "finish"));
    delta_begin(p);
    kite_status status = drain(p, true);
    stream_flush(&p->reasoning);
    stream_flush(&p->content);
    p->finished = true;
    return delta_end(p, status, delta);
}

void chat_output_result(const chat_output_parser *p, chat_output_delta *result) {
    memset(result, 0, sizeof *result);
    result->reasoning = p->reasoning.all.data ? p->reasoning.all.data : "";
    result->reasoning_length = p->reasoning.all.length;
    result->content = p->content.all.data ? p->content.all.data : "";
    result->content_length = p->content.all.length;
    result->calls = p->calls;
    result->n_calls = p->n_calls;
}

void chat_output_free(chat_output_parser *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_calls; i++) free_call(&p->calls[i]);
    free(p->calls);
    text_builder_free(&p->pending);
    text_builder_free(&p->reasoning.delta);
    text_builder_free(&p->reasoning.all);
    text_builder_free(&p->content.delta);
    text_builder_free(&p->content.all);
    free(p);
}

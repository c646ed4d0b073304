#include "chat/chat_tool_choice.h"

#include <stdlib.h>
#include <string.h>

#include "chat/python_json.h"
#include "util/error.h"
#include "util/text_builder.h"

/* Qwen3's template writes an assistant tool call as '<tool_call>\n{"name": "' NAME '", "arguments": ' ARGS
 * '}\n</tool_call>' (after '</think>\n\n' when the turn has no content). */
static const char REQUIRED_OPENING[] = "<tool_call>\n{\"name\": \"";
static const char NAMED_OPENING[] = "<tool_call>\n{\"name\": ";
static const char NAMED_AFTER_NAME[] = ", \"arguments\":";

static bool string_is(const json_value *v, const char *text) {
    return json_is_string(v) && v->length == strlen(text) && memcmp(v->as.string, text, v->length) == 0;
}

static bool same_string(const json_value *a, const json_value *b) {
    return a->length == b->length && memcmp(a->as.string, b->as.string, a->length) == 0;
}

/* tools[i].function.name, or NULL when that tool has none. */
static const json_value *tool_name(const json_value *tools, size_t i) {
    const json_value *function = json_object_member(&tools->as.items[i], "function");
    const json_value *name = json_is_object(function) ? json_object_member(function, "name") : NULL;
    return json_is_string(name) ? name : NULL;
}

kite_status chat_tool_choice_read(const json_value *root, const json_value *tools, chat_tool_choice *out) {
    *out = (chat_tool_choice){.choice = KITE_TOOL_CHOICE_AUTO};
    const json_value *choice = json_object_member(root, "tool_choice");
    if (!choice || json_is_null(choice)) return KITE_OK;
    if (string_is(choice, "auto")) return KITE_OK;
    if (string_is(choice, "none")) {
        out->choice = KITE_TOOL_CHOICE_NONE;
        return KITE_OK;
    }
    if (string_is(choice, "required")) {
        out->choice = KITE_TOOL_CHOICE_REQUIRED;
    } else if (json_is_object(choice)) {
        if (!string_is(json_object_member(choice, "type"), "function"))
            return kite_fail(KITE_ERROR_INVALID_INPUT, "tool_choice.type: expected \"function\"");
        const json_value *function = json_object_member(choice, "function");
        const json_value *name = json_is_object(function) ? json_object_member(function, "name") : NULL;
        if (!json_is_string(name))
            return kite_fail(KITE_ERROR_INVALID_INPUT, "tool_choice.function.name: expected a string");
        out->choice = KITE_TOOL_CHOICE_NAMED;
        out->name = name;
    } else {
        return kite_fail(KITE_ERROR_INVALID_INPUT,
                         "tool_choice: expected \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                         "\"function\": {\"name\": ...}}");
    }
    if (!tools)
        return kite_fail(KITE_ERROR_INVALID_INPUT, "tool_choice: %s needs tools, and the request offers none",
                         out->choice == KITE_TOOL_CHOICE_REQUIRED ? "\"required\"" : "a named function");
    bool found = false;
    for (size_t i = 0; i < tools->length; i++) {
        const json_value *name = tool_name(tools, i);
        /* A call names its tool by this string; one without it, or with a NUL the parser's names cannot hold,
         * could never be called. */
        if (!name || memchr(name->as.string, '\0', name->length))
            return kite_fail(KITE_ERROR_INVALID_INPUT, "tools[%zu].function.name: expected a string without NUL", i);
        found |= out->name && same_string(name, out->name);
    }
    if (out->name && !found)
        return kite_fail(KITE_ERROR_INVALID_INPUT,
                         "tool_choice.function.name: \"%.*s\" is not one of the request's tools",
                         (int)(out->name->length < 128 ? out->name->length : 128), out->name->as.string);
    return KITE_OK;
}

bool chat_tool_choice_forces(const chat_tool_choice *choice) {
    return choice->choice == KITE_TOOL_CHOICE_REQUIRED || choice->choice == KITE_TOOL_CHOICE_NAMED;
}

static char *copy_string(const json_value *v) {
    char *s = malloc(v->length + 1);
    if (!s) return NULL;
    memcpy(s, v->as.string, v->length);
    s[v->length] = '\0';
    return s;
}

kite_status chat_tool_choice_prepare(const chat_tool_choice *choice, const json_value *tools,
                                     kite_chat_prompt *prompt) {
    prompt->tool_choice = choice->choice;
    if (!chat_tool_choice_forces(choice)) return KITE_OK;
    text_builder b = {0};
    if (choice->choice == KITE_TOOL_CHOICE_REQUIRED) {
        text_builder_puts(&b, REQUIRED_OPENING);
    } else {
        text_builder_puts(&b, NAMED_OPENING);
        python_json_string(&b, choice->name->as.string, choice->name->length);
        text_builder_puts(&b, NAMED_AFTER_NAME);
    }
    prompt->forced = text_builder_take(&b, &prompt->forced_length);
    const size_t n = choice->choice == KITE_TOOL_CHOICE_NAMED ? 1 : tools->length;
    prompt->call_names = calloc(n, sizeof *prompt->call_names);
    if (!prompt->forced || !prompt->call_names)
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "chat: out of memory for the tool choice");
    prompt->n_call_names = n;
    for (size_t i = 0; i < n; i++) {
        prompt->call_names[i] =
            copy_string(choice->choice == KITE_TOOL_CHOICE_NAMED ? choice->name : tool_name(tools, i));
        if (!prompt->call_names[i])
            return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "chat: out of memory for the tool names");
    }
    return KITE_OK;
}

#include "chat/chat_format.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/chat_tool_choice.h"
#include "chat/jinja.h"
#include "chat/python_json.h"
#include "util/error.h"
#include "util/file.h"
#include "util/json.h"
#include "util/text_builder.h"

/* Real templates are a few KB; tokenizer_config.json holds the whole added-token table (~20 KB for Qwen3). */
#define CHAT_TEMPLATE_MAX_BYTES ((size_t)4 << 20)
#define GENERATION_CONFIG_MAX_BYTES ((size_t)1 << 20)
/* A request body: the server's limit is lower; this one only keeps a library caller from rendering gigabytes. */
#define CHAT_REQUEST_MAX_BYTES ((size_t)256 << 20)

struct chat_format {
    const tokenizer *tokenizer;
    jinja_template *template_default;
    jinja_template *template_tools; /* "tool_use" of a named list, or NULL */
    char *special_variables;        /* "\"eos_token\": \"<|im_end|>\", ..." : members of the variables object */
    int32_t stop_ids[CHAT_MAX_STOP_IDS];
    int32_t n_stop_ids;
    kite_sampling sampling;
};

/* ---- loading ------------------------------------------------------------------------------------ */

static kite_status read_optional(const char *dir, const char *name, size_t max_bytes, kite_status too_large,
                                 char **text, size_t *length, char **path_out) {
    *text = NULL;
    *length = 0;
    char *path = path_join(dir, name);
    if (!path) return KITE_ERROR_OUT_OF_MEMORY;
    kite_status status = path_exists(path) ? file_read_all(path, max_bytes, too_large, text, length) : KITE_OK;
    if (path_out && status == KITE_OK)
        *path_out = path;
    else
        free(path);
    return status;
}

static kite_status parse_template(const char *source, size_t length, const char *name, jinja_template **out) {
    kite_status status = jinja_parse(source, length, name, out);
    if (status != KITE_OK && status != KITE_ERROR_OUT_OF_MEMORY) status = KITE_ERROR_INVALID_TEMPLATE;
    return status;
}

/* tokenizer_config.json's chat_template: a string, or [{"name": ..., "template": ...}, ...]. */
static kite_status templates_from_config(chat_format *f, const json_value *config, const char *path) {
    const json_value *t = json_object_member(config, "chat_template");
    if (!t || json_is_null(t)) return KITE_OK;
    char name[512];
    snprintf(name, sizeof name, "%s chat_template", path);
    if (json_is_string(t)) return parse_template(t->as.string, t->length, name, &f->template_default);
    if (!json_is_array(t))
        return kite_fail(KITE_ERROR_INVALID_TEMPLATE, "%s: chat_template: expected a string or a list of "
                                                      "{name, template}", path);
    for (size_t i = 0; i < t->length; i++) {
        const json_value *item = &t->as.items[i];
        const json_value *n = json_object_member(item, "name"), *body = json_object_member(item, "template");
        if (!json_is_string(n) || !json_is_string(body))
            return kite_fail(KITE_ERROR_INVALID_TEMPLATE, "%s: chat_template[%zu]: expected {name, template} strings",
                             path, i);
        jinja_template **slot = strcmp(n->as.string, "default") == 0    ? &f->template_default
                                : strcmp(n->as.string, "tool_use") == 0 ? &f->template_tools
                                                                       : NULL;
        if (!slot) continue; /* other named templates (rag, ...) are chosen by name, which requests cannot do */
        if (*slot)
            return kite_fail(KITE_ERROR_INVALID_TEMPLATE, "%s: chat_template: two templates named \"%s\"", path,
                             n->as.string);
        snprintf(name, sizeof name, "%s chat_template \"%s\"", path, n->as.string);
        KITE_TRY(parse_template(body->as.string, body->length, name, slot));
    }
    if (!f->template_default && f->template_tools)
        return kite_fail(KITE_ERROR_INVALID_TEMPLATE, "%s: chat_template: a \"tool_use\" template but no \"default\"",
                         path);
    return KITE_OK;
}

/* A special token as tokenizer_config.json writes it: a string or {"content": ...}; NULL when unset. */
static const json_value *token_content(const json_value *v) {
    if (json_is_object(v)) v = json_object_member(v, "content");
    return json_is_string(v) ? v : NULL;
}

/* The special tokens transformers passes to every template (its special_tokens_map: the ones that are set). */
static kite_status special_variables_from_config(chat_format *f, const json_value *config, const char *path) {
    static const char *const names[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                        "pad_token", "cls_token", "mask_token"};
    text_builder b = {0};
    for (size_t i = 0; config && i < sizeof names / sizeof names[0]; i++) {
        const json_value *v = json_object_member(config, names[i]);
        if (!v || json_is_null(v)) continue;
        const json_value *content = token_content(v);
        if (!content) {
            text_builder_free(&b);
            return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: %s: expected a string or {\"content\": ...}", path,
                             names[i]);
        }
        if (b.length) text_builder_puts(&b, ", ");
        python_json_string(&b, names[i], strlen(names[i]));
        text_builder_puts(&b, ": ");
        python_json_string(&b, content->as.string, content->length);
    }
    const json_value *extra = config ? json_object_member(config, "additional_special_tokens") : NULL;
    if (extra && !json_is_null(extra)) {
        if (!json_is_array(extra)) {
            text_builder_free(&b);
            return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: additional_special_tokens: expected a list", path);
        }
        if (b.length) text_builder_puts(&b, ", ");
        text_builder_puts(&b, "\"additional_special_tokens\": [");
        for (size_t i = 0; i < extra->length; i++) {
            const json_value *content = token_content(&extra->as.items[i]);
            if (!content) {
                text_builder_free(&b);
                return kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: additional_special_tokens[%zu]: expected a string",
                                 path, i);
            }
            if (i) text_builder_puts(&b, ", ");
            python_json_string(&b, content->as.string, content->length);
        }
        text_builder_putc(&b, ']');
    }
    f->special_variables = text_builder_take(&b, NULL);
    return f->special_variables ? KITE_OK : kite_fail(KITE_ERROR_OUT_OF_MEMORY, "chat: out of memory");
}

static void add_stop_id(chat_format *f, int32_t id) {
    if (id < 0) return;
    for (int32_t i = 0; i < f->n_stop_ids; i++)
        if (f->stop_ids[i] == id) return;
    if (f->n_stop_ids < CHAT_MAX_STOP_IDS) f->stop_ids[f->n_stop_ids++] = id;
}

static kite_status read_float_field(const json_value *root, const char *key, const char *path, float min, float max,
                                    float *out) {
    const json_value *v = json_object_member(root, key);
    if (!v || json_is_null(v)) return KITE_OK;
    double d;
    if (!json_get_double(v, &d) || !(d >= min && d <= max))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: %s: expected a number in [%g, %g]", path, key, min, max);
    *out = (float)d;
    return KITE_OK;
}

/* generation_config.json: the sampling a request without its own uses, and more eos ids. */
static kite_status generation_config(chat_format *f, const char *dir) {
    f->sampling = kite_sampling_default();
    char *text = NULL, *path = NULL;
    size_t length = 0;
    KITE_TRY(read_optional(dir, "generation_config.json", GENERATION_CONFIG_MAX_BYTES, KITE_ERROR_INVALID_CHECKPOINT,
                           &text, &length, &path));
    if (!text) {
        free(path);
        return KITE_OK;
    }
    json_error error;
    json_document *doc = json_parse(text, length, &error);
    free(text);
    kite_status status = KITE_OK;
    if (!doc)
        status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s:%d:%d: %s", path, error.line, error.column,
                           error.message);
    const json_value *root = doc ? json_root(doc) : NULL;
    if (status == KITE_OK && !json_is_object(root))
        status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: expected a JSON object", path);
    kite_sampling s = kite_sampling_default();
    s.temperature = 1.0f; /* transformers' GenerationConfig defaults, which sampling starts from */
    s.top_k = 50;
    bool do_sample = false;
    if (status == KITE_OK) {
        const json_value *v = json_object_member(root, "do_sample");
        if (v && !json_is_null(v) && !json_get_bool(v, &do_sample))
            status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: do_sample: expected true or false", path);
    }
    if (status == KITE_OK) status = read_float_field(root, "temperature", path, 0.0f, 100.0f, &s.temperature);
    if (status == KITE_OK) status = read_float_field(root, "top_p", path, 0.0f, 1.0f, &s.top_p);
    if (status == KITE_OK) status = read_float_field(root, "min_p", path, 0.0f, 1.0f, &s.min_p);
    if (status == KITE_OK)
        status = read_float_field(root, "repetition_penalty", path, 0.01f, 100.0f, &s.repetition_penalty);
    if (status == KITE_OK) {
        const json_value *v = json_object_member(root, "top_k");
        int64_t k = 0;
        if (v && !json_is_null(v)) {
            if (!json_get_int64(v, &k) || k < 0 || k > INT32_MAX)
                status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: top_k: expected a non-negative integer", path);
            else
                s.top_k = (int32_t)k;
        }
    }
    if (status == KITE_OK) {
        const json_value *v = json_object_member(root, "eos_token_id");
        const size_t n = json_is_array(v) ? v->length : (v && !json_is_null(v) ? 1 : 0);
        for (size_t i = 0; i < n && status == KITE_OK; i++) {
            const json_value *item = json_is_array(v) ? &v->as.items[i] : v;
            int64_t id;
            if (!json_get_int64(item, &id) || id < 0 || id >= tokenizer_vocab_size(f->tokenizer))
                status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                                   "%s: eos_token_id: expected token ids below the vocabulary size %d", path,
                                   tokenizer_vocab_size(f->tokenizer));
            else
                add_stop_id(f, (int32_t)id);
        }
    }
    if (status == KITE_OK && do_sample && s.temperature > 0.0f) f->sampling = s;
    json_free(doc);
    free(path);
    return status;
}

/* The token that ends an assistant turn, found the way a reader of the template would: render a two-message
 * conversation and take the first special token after the answer's text. A template that refuses the probe
 * leaves it to the eos ids. */
static void find_end_of_turn(chat_format *f) {
    static const char probe[] = "{\"messages\": [{\"role\": \"user\", \"content\": \"kite-probe-question\"}, "
                                "{\"role\": \"assistant\", \"content\": \"kite-probe-answer\"}], "
                                "\"add_generation_prompt\": false}";
    kite_chat_prompt p;
    if (chat_format_render(f, probe, sizeof probe - 1, &p) != KITE_OK) return;
    const char *answer = strstr(p.text, "kite-probe-answer");
    if (answer) {
        const char *after = answer + strlen("kite-probe-answer");
        int32_t *ids = NULL;
        size_t n = 0;
        if (tokenizer_encode(f->tokenizer, after, strlen(after), &ids, &n) == KITE_OK)
            for (size_t i = 0; i < n; i++)
                if (tokenizer_is_special(f->tokenizer, ids[i])) {
                    add_stop_id(f, ids[i]);
                    break;
                }
        free(ids);
    }
    kite_chat_prompt_free(&p);
}

kite_status chat_format_load(const char *dir, const tokenizer *tok, chat_format **out) {
    return chat_format_load_template(dir, NULL, tok, out);
}

kite_status chat_format_load_template(const char *dir, const char *template_path, const tokenizer *tok,
                                      chat_format **out) {
    *out = NULL;
    if (!dir || !tok) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "chat_format_load: NULL argument");
    chat_format *f = calloc(1, sizeof *f);
    if (!f) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "chat: out of memory");
    f->tokenizer = tok;
    char *config_text = NULL, *config_path = NULL, *jinja_text = NULL, *jinja_path = NULL;
    size_t config_length = 0, jinja_length = 0;
    json_document *config = NULL;
    kite_status status = read_optional(dir, "tokenizer_config.json", TOKENIZER_CONFIG_MAX_BYTES,
                                       KITE_ERROR_INVALID_TOKENIZER, &config_text, &config_length, &config_path);
    if (status == KITE_OK && config_text) {
        json_error error;
        config = json_parse(config_text, config_length, &error);
        if (!config)
            status = kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s:%d:%d: %s", config_path, error.line, error.column,
                               error.message);
        else if (!json_is_object(json_root(config)))
            status = kite_fail(KITE_ERROR_INVALID_TOKENIZER, "%s: expected a JSON object", config_path);
    }
    if (status == KITE_OK && template_path) {
        jinja_path = strdup(template_path);
        if (!jinja_path) status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "chat: out of memory");
        if (status == KITE_OK)
            status = file_read_all(template_path, CHAT_TEMPLATE_MAX_BYTES, KITE_ERROR_INVALID_TEMPLATE, &jinja_text,
                                   &jinja_length);
    } else if (status == KITE_OK) {
        status = read_optional(dir, "chat_template.jinja", CHAT_TEMPLATE_MAX_BYTES, KITE_ERROR_INVALID_TEMPLATE,
                               &jinja_text, &jinja_length, &jinja_path);
    }
    if (status == KITE_OK && jinja_text)
        status = parse_template(jinja_text, jinja_length, jinja_path, &f->template_default);
    else if (status == KITE_OK && config)
        status = templates_from_config(f, json_root(config), config_path);
    const bool has_template = f->template_default != NULL;
    if (status == KITE_OK && has_template)
        status = special_variables_from_config(f, config ? json_root(config) : NULL, config_path);
    if (status == KITE_OK && has_template) status = generation_config(f, dir);
    json_free(config);
    free(config_text);
    free(config_path);
    free(jinja_text);
    free(jinja_path);
    if (status != KITE_OK || !has_template) {
        chat_format_free(f);
        return status;
    }
    find_end_of_turn(f);
    *out = f;
    return KITE_OK;
}

void chat_format_free(chat_format *f) {
    if (!f) return;
    jinja_free(f->template_default);
    jinja_free(f->template_tools);
    free(f->special_variables);
    free(f);
}

int32_t chat_format_stop_ids(const chat_format *f, int32_t *ids) {
    if (!f) return 0;
    memcpy(ids, f->stop_ids, (size_t)f->n_stop_ids * sizeof *ids);
    return f->n_stop_ids;
}

kite_sampling chat_format_sampling_defaults(const chat_format *f) {
    return f ? f->sampling : kite_sampling_default();
}

/* ---- a request ---------------------------------------------------------------------------------- */

/* content as the template sees it: a string ("" for null, which templates would otherwise fail on), or the
 * text parts of a list joined with "\n". */
static kite_status write_content(text_builder *b, const json_value *content, size_t index) {
    if (!content || json_is_null(content)) {
        text_builder_puts(b, "\"\"");
        return KITE_OK;
    }
    if (json_is_string(content)) {
        python_json_string(b, content->as.string, content->length);
        return KITE_OK;
    }
    if (!json_is_array(content))
        return kite_fail(KITE_ERROR_INVALID_INPUT, "messages[%zu].content: expected a string, null or a list of parts",
                         index);
    text_builder joined = {0};
    for (size_t i = 0; i < content->length; i++) {
        const json_value *part = &content->as.items[i];
        const json_value *type = json_object_member(part, "type"), *text = json_object_member(part, "text");
        if (!json_is_string(type) || strcmp(type->as.string, "text") != 0 || !json_is_string(text)) {
            text_builder_free(&joined);
            return kite_fail(json_is_string(type) && strcmp(type->as.string, "text") != 0 ? KITE_ERROR_UNSUPPORTED
                                                                                           : KITE_ERROR_INVALID_INPUT,
                             "messages[%zu].content[%zu]: only {\"type\": \"text\", \"text\": ...} parts are supported",
                             index, i);
        }
        if (i) text_builder_putc(&joined, '\n');
        text_builder_append(&joined, text->as.string, text->length);
    }
    python_json_string(b, joined.data ? joined.data : "", joined.length);
    const bool failed = joined.failed;
    text_builder_free(&joined);
    return failed ? kite_fail(KITE_ERROR_OUT_OF_MEMORY, "chat: out of memory") : KITE_OK;
}

/* A tool call's arguments: the object itself, or a JSON string parsed into one ("" and absent give {}). */
static kite_status write_arguments(text_builder *b, const json_value *arguments, size_t message, size_t call) {
    if (!arguments || json_is_null(arguments) || (json_is_string(arguments) && arguments->length == 0)) {
        text_builder_puts(b, "{}");
        return KITE_OK;
    }
    if (!json_is_string(arguments)) {
        python_json_value(b, arguments, -1, false);
        return KITE_OK;
    }
    json_error error; /* a repeated key is refused here too, as in the request around it */
    json_document *doc = json_parse(arguments->as.string, arguments->length, &error);
    if (!doc)
        return kite_fail(KITE_ERROR_INVALID_INPUT, "messages[%zu].tool_calls[%zu].function.arguments: not JSON (%s)",
                         message, call, error.message);
    python_json_value(b, json_root(doc), -1, false);
    json_free(doc);
    return KITE_OK;
}

static kite_status write_tool_calls(text_builder *b, const json_value *calls, size_t index) {
    if (!json_is_array(calls)) {
        if (json_is_null(calls)) {
            text_builder_puts(b, "null");
            return KITE_OK;
        }
        return kite_fail(KITE_ERROR_INVALID_INPUT, "messages[%zu].tool_calls: expected a list", index);
    }
    text_builder_putc(b, '[');
    for (size_t i = 0; i < calls->length; i++) {
        const json_value *call = &calls->as.items[i];
        if (!json_is_object(call))
            return kite_fail(KITE_ERROR_INVALID_INPUT, "messages[%zu].tool_calls[%zu]: expected an object", index, i);
        if (i) text_builder_puts(b, ", ");
        text_builder_putc(b, '{');
        for (size_t m = 0; m < call->length; m++) {
            const json_member *member = &call->as.members[m];
            if (m) text_builder_puts(b, ", ");
            python_json_string(b, member->key, member->key_length);
            text_builder_puts(b, ": ");
            if (strcmp(member->key, "function") != 0) {
                python_json_value(b, &member->value, -1, false);
                continue;
            }
            const json_value *function = &member->value;
            if (!json_is_object(function) || !json_is_string(json_object_member(function, "name")))
                return kite_fail(KITE_ERROR_INVALID_INPUT,
                                 "messages[%zu].tool_calls[%zu].function: expected an object with a name", index, i);
            text_builder_putc(b, '{');
            bool has_arguments = false;
            for (size_t k = 0; k < function->length; k++) {
                const json_member *field = &function->as.members[k];
                if (k) text_builder_puts(b, ", ");
                python_json_string(b, field->key, field->key_length);
                text_builder_puts(b, ": ");
                if (strcmp(field->key, "arguments") == 0) {
                    has_arguments = true;
                    KITE_TRY(write_arguments(b, &field->value, index, i));
                } else {
                    python_json_value(b, &field->value, -1, false);
                }
            }
            if (!has_arguments) text_builder_puts(b, ", \"arguments\": {}");
            text_builder_putc(b, '}');
        }
        text_builder_putc(b, '}');
    }
    text_builder_putc(b, ']');
    return KITE_OK;
}

static kite_status write_messages(text_builder *b, const json_value *messages) {
    if (!json_is_array(messages) || messages->length == 0)
        return kite_fail(KITE_ERROR_INVALID_INPUT, "messages: expected a non-empty list");
    text_builder_putc(b, '[');
    for (size_t i = 0; i < messages->length; i++) {
        const json_value *message = &messages->as.items[i];
        if (!json_is_object(message))
            return kite_fail(KITE_ERROR_INVALID_INPUT, "messages[%zu]: expected an object", i);
        const json_value *role = json_object_member(message, "role");
        if (!json_is_string(role))
            return kite_fail(KITE_ERROR_INVALID_INPUT, "messages[%zu].role: expected a string", i);
        if (i) text_builder_puts(b, ", ");
        text_builder_putc(b, '{');
        for (size_t m = 0; m < message->length; m++) {
            const json_member *member = &message->as.members[m];
            if (m) text_builder_puts(b, ", ");
            python_json_string(b, member->key, member->key_length);
            text_builder_puts(b, ": ");
            if (strcmp(member->key, "content") == 0)
                KITE_TRY(write_content(b, &member->value, i));
            else if (strcmp(member->key, "tool_calls") == 0)
                KITE_TRY(write_tool_calls(b, &member->value, i));
            else
                python_json_value(b, &member->value, -1, false);
        }
        /* OpenAI's clients may leave content out of an assistant turn with tool calls; templates read it. */
        if (!json_object_member(message, "content")) text_builder_puts(b, ", \"content\": \"\"");
        text_builder_putc(b, '}');
    }
    text_builder_putc(b, ']');
    return KITE_OK;
}

/* Template variables that a request's chat_template_kwargs may not replace. */
static bool reserved_variable(const char *name) {
    static const char *const reserved[] = {"messages", "tools", "documents", "add_generation_prompt"};
    for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
        if (strcmp(name, reserved[i]) == 0) return true;
    return false;
}

typedef struct request_view {
    const json_value *messages, *tools, *kwargs;
    bool add_generation_prompt;
    bool tools_called; /* tools offered and tool_choice allows calling them */
    bool thinking;
    chat_tool_choice choice;
} request_view;

static kite_status read_request(const json_value *root, request_view *r) {
    *r = (request_view){.add_generation_prompt = true, .thinking = true};
    if (!json_is_object(root)) return kite_fail(KITE_ERROR_INVALID_INPUT, "chat request: expected a JSON object");
    r->messages = json_object_member(root, "messages");
    r->tools = json_object_member(root, "tools");
    if (r->tools && json_is_null(r->tools)) r->tools = NULL;
    if (r->tools && !json_is_array(r->tools))
        return kite_fail(KITE_ERROR_INVALID_INPUT, "tools: expected a list of function tools");
    for (size_t i = 0; r->tools && i < r->tools->length; i++)
        if (!json_is_object(&r->tools->as.items[i]))
            return kite_fail(KITE_ERROR_INVALID_INPUT, "tools[%zu]: expected an object", i);
    if (r->tools && r->tools->length == 0) r->tools = NULL; /* as vLLM: an empty list offers nothing */
    const json_value *v = json_object_member(root, "add_generation_prompt");
    if (v && !json_is_null(v) && !json_get_bool(v, &r->add_generation_prompt))
        return kite_fail(KITE_ERROR_INVALID_INPUT, "add_generation_prompt: expected true or false");
    KITE_TRY(chat_tool_choice_read(root, r->tools, &r->choice));
    r->tools_called = r->tools != NULL && r->choice.choice != KITE_TOOL_CHOICE_NONE;
    r->kwargs = json_object_member(root, "chat_template_kwargs");
    if (r->kwargs && json_is_null(r->kwargs)) r->kwargs = NULL;
    if (r->kwargs && !json_is_object(r->kwargs))
        return kite_fail(KITE_ERROR_INVALID_INPUT, "chat_template_kwargs: expected an object");
    for (size_t i = 0; r->kwargs && i < r->kwargs->length; i++) {
        const json_member *m = &r->kwargs->as.members[i];
        if (reserved_variable(m->key))
            return kite_fail(KITE_ERROR_INVALID_INPUT, "chat_template_kwargs.%s: set by the request itself", m->key);
        if (strcmp(m->key, "enable_thinking") == 0 && m->value.type == JSON_TYPE_FALSE) r->thinking = false;
    }
    return KITE_OK;
}

/* The variables object the template renders with (see chat_format.h); with thinking_off, enable_thinking is
 * false whatever the request says. */
static kite_status write_variables(const chat_format *f, const request_view *r, bool thinking_off, text_builder *b) {
    text_builder_puts(b, "{\"messages\": ");
    KITE_TRY(write_messages(b, r->messages));
    text_builder_puts(b, ", \"tools\": ");
    if (r->tools)
        python_json_value(b, r->tools, -1, false);
    else
        text_builder_puts(b, "null");
    text_builder_printf(b, ", \"documents\": null, \"add_generation_prompt\": %s",
                        r->add_generation_prompt ? "true" : "false");
    if (f->special_variables[0]) {
        text_builder_puts(b, ", ");
        text_builder_puts(b, f->special_variables);
    }
    const bool forced = thinking_off;
    for (size_t i = 0; r->kwargs && i < r->kwargs->length; i++) {
        const json_member *m = &r->kwargs->as.members[i];
        if (forced && strcmp(m->key, "enable_thinking") == 0) continue; /* written below */
        text_builder_puts(b, ", ");
        python_json_string(b, m->key, m->key_length);
        text_builder_puts(b, ": ");
        python_json_value(b, &m->value, -1, false);
    }
    if (forced) text_builder_puts(b, ", \"enable_thinking\": false");
    text_builder_putc(b, '}');
    return b->failed ? kite_fail(KITE_ERROR_OUT_OF_MEMORY, "chat: out of memory") : KITE_OK;
}

/* Whether the prompt leaves a <think> open: the answer then starts inside the reasoning. */
static bool ends_inside_think(const char *text) {
    const char *open = NULL;
    for (const char *p = strstr(text, "<think>"); p; p = strstr(p + 1, "<think>")) open = p;
    return open && !strstr(open, "</think>");
}

/* The forced opening at the end of the rendered text (a prompt that leaves no <think> open). */
static kite_status append_forced(kite_chat_prompt *out) {
    char *text = realloc(out->text, out->length + out->forced_length + 1);
    if (!text) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "chat: out of memory for the prompt");
    memcpy(text + out->length, out->forced, out->forced_length + 1);
    out->text = text;
    out->length += out->forced_length;
    return KITE_OK;
}

/* The forced opening as an insertion after the model's </think> (kite_chat_prompt.insert_ids):
 * CHAT_THINK_SEPARATOR and the opening, tokenized alone. The ids are those of the template's own rendering of
 * such a turn, since </think> and <tool_call> are added tokens the tokenizer splits at (chat_format_test checks
 * it). *ok false when the tokenizer has no single </think> token to wait for. */
static kite_status prepare_insertion(const chat_format *f, kite_chat_prompt *out, bool *ok) {
    *ok = false;
    int32_t *end_ids = NULL;
    size_t n_end = 0;
    KITE_TRY(tokenizer_encode(f->tokenizer, "</think>", strlen("</think>"), &end_ids, &n_end));
    const int32_t end_id = n_end == 1 ? end_ids[0] : -1;
    free(end_ids);
    if (end_id < 0) return KITE_OK;
    text_builder b = {0};
    text_builder_puts(&b, CHAT_THINK_SEPARATOR);
    text_builder_append(&b, out->forced, out->forced_length);
    if (b.failed) {
        text_builder_free(&b);
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "chat: out of memory");
    }
    kite_status status = tokenizer_encode(f->tokenizer, b.data, b.length, &out->insert_ids, &out->n_insert_ids);
    text_builder_free(&b);
    KITE_TRY(status);
    if (out->n_insert_ids > KITE_MAX_INSERT_IDS)
        return kite_fail(KITE_ERROR_INVALID_INPUT, "tool_choice: the forced call's opening is %zu tokens, at most %d",
                         out->n_insert_ids, KITE_MAX_INSERT_IDS);
    out->insert_after = end_id;
    *ok = true;
    return KITE_OK;
}

static kite_status render_text(const chat_format *f, const request_view *r, bool thinking_off, char **text,
                               size_t *length) {
    *text = NULL;
    *length = 0;
    text_builder variables = {0};
    kite_status status = write_variables(f, r, thinking_off, &variables);
    json_document *vars = NULL;
    if (status == KITE_OK) {
        json_error error;
        vars = json_parse(variables.data, variables.length, &error);
        if (!vars) status = kite_fail(KITE_ERROR_INVALID_INPUT, "chat request: %s", error.message);
    }
    text_builder_free(&variables);
    const jinja_template *t = r->tools && f->template_tools ? f->template_tools : f->template_default;
    if (status == KITE_OK) status = jinja_render(t, json_root(vars), text, length);
    json_free(vars);
    return status;
}

/* A forced tool choice's place (chat_tool_choice.h). The model thinks first when the request lets it and the
 * template thinks: it leaves <think> open (QwQ's, whatever enable_thinking says), or its prompt changes with
 * enable_thinking false (Qwen3's empty think block); the opening is then inserted after the model's </think>.
 * Otherwise the prompt is the one enable_thinking false renders and ends with the opening. */
static kite_status place_forced(const chat_format *f, const request_view *r, kite_chat_prompt *out, bool *thinking) {
    bool insert = ends_inside_think(out->text);
    if (!insert && r->thinking) {
        char *plain = NULL;
        size_t plain_length = 0;
        KITE_TRY(render_text(f, r, true, &plain, &plain_length));
        insert = plain_length != out->length || memcmp(plain, out->text, plain_length) != 0;
        free(plain);
    }
    if (insert) {
        bool ok = false;
        KITE_TRY(prepare_insertion(f, out, &ok));
        if (ok) {
            *thinking = true;
            return KITE_OK;
        }
        if (ends_inside_think(out->text))
            return kite_fail(KITE_ERROR_UNSUPPORTED, "tool_choice: this chat template opens <think> for the answer and "
                                                     "the tokenizer has no single </think> token to place the forced "
                                                     "tool call after");
    }
    *thinking = false;
    if (r->thinking) { /* the prompt without thinking: the template's empty think block before the opening */
        free(out->text);
        out->text = NULL;
        KITE_TRY(render_text(f, r, true, &out->text, &out->length));
    }
    return append_forced(out);
}

kite_status chat_format_render(const chat_format *f, const char *request_json, size_t length, kite_chat_prompt *out) {
    *out = (kite_chat_prompt){0};
    if (!f || !request_json) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "chat_format_render: NULL argument");
    if (length > CHAT_REQUEST_MAX_BYTES)
        return kite_fail(KITE_ERROR_INVALID_INPUT, "chat request: %zu bytes, at most %zu", length,
                         CHAT_REQUEST_MAX_BYTES);
    /* json_parse refuses a key repeated in one object: vLLM's json.loads would keep its last value, so a
     * request with one is refused rather than guessed at. */
    json_error error;
    json_document *doc = json_parse(request_json, length, &error);
    if (!doc)
        return kite_fail(KITE_ERROR_INVALID_INPUT, "chat request:%d:%d: %s", error.line, error.column, error.message);
    request_view r;
    kite_status status = read_request(json_root(doc), &r);
    bool thinking = r.thinking;
    if (status == KITE_OK) status = render_text(f, &r, false, &out->text, &out->length);
    if (status == KITE_OK) status = chat_tool_choice_prepare(&r.choice, r.tools, out);
    if (status == KITE_OK && out->forced) status = place_forced(f, &r, out, &thinking);
    json_free(doc); /* r's values live in it until here */
    if (status == KITE_OK) status = tokenizer_encode(f->tokenizer, out->text, out->length, &out->ids, &out->n_ids);
    if (status != KITE_OK) {
        kite_chat_prompt_free(out);
        return status;
    }
    out->thinking = thinking;
    out->starts_in_reasoning = ends_inside_think(out->text);
    out->has_tools = r.tools_called;
    return KITE_OK;
}

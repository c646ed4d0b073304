/* The chat half of kite.h: a chat format loaded on its own (with its own tokenizer) or the model's.
 *
 * A kite_chat is a chat format with the tokenizer it renders for; the model's borrows the model's tokenizer. */
#include <stdlib.h>

#include "chat/chat_format.h"
#include "chat/chat_public.h"
#include "kite.h"
#include "model/model.h"
#include "util/error.h"

kite_status chat_public_create(const char *dir, const char *template_path, const tokenizer *borrowed,
                               kite_chat **out) {
    *out = NULL;
    kite_chat *c = calloc(1, sizeof *c);
    if (!c) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "chat: out of memory");
    kite_status status = KITE_OK;
    if (borrowed)
        c->tokenizer = borrowed;
    else if ((status = tokenizer_load(dir, &c->owned_tokenizer)) == KITE_OK)
        c->tokenizer = c->owned_tokenizer;
    if (status == KITE_OK) status = chat_format_load_template(dir, template_path, c->tokenizer, &c->format);
    if (status != KITE_OK || !c->format) {
        kite_chat_free(c);
        return status;
    }
    *out = c;
    return KITE_OK;
}

kite_status kite_chat_load(const char *dir, const char *template_path, kite_chat **out) {
    if (!out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_chat_load: no place for the result");
    *out = NULL;
    if (!dir) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_chat_load: no directory given");
    KITE_TRY(chat_public_create(dir, template_path, NULL, out));
    if (!*out)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "%s: no chat template (neither chat_template.jinja nor a chat_template in "
                         "tokenizer_config.json)",
                         dir);
    return KITE_OK;
}

void kite_chat_free(kite_chat *c) {
    if (!c) return;
    chat_format_free(c->format);
    tokenizer_free(c->owned_tokenizer);
    free(c);
}

const kite_chat *kite_model_chat(const kite_model *model) { return model ? model->chat : NULL; }

kite_status kite_chat_render(const kite_chat *c, const char *request_json, size_t length, kite_chat_prompt *out) {
    if (!out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_chat_render: no place for the prompt");
    *out = (kite_chat_prompt){0};
    if (!c) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_chat_render: no chat format given");
    if (!request_json) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_chat_render: no request given");
    return chat_format_render(c->format, request_json, length, out);
}

void kite_chat_prompt_free(kite_chat_prompt *p) {
    if (!p) return;
    free(p->text);
    free(p->ids);
    free(p->forced);
    free(p->insert_ids);
    for (size_t i = 0; p->call_names && i < p->n_call_names; i++) free(p->call_names[i]);
    free(p->call_names);
    *p = (kite_chat_prompt){0};
}

int32_t kite_chat_stop_ids(const kite_chat *c, int32_t *ids, int32_t capacity) {
    if (!c) return 0;
    int32_t all[CHAT_MAX_STOP_IDS];
    const int32_t n = chat_format_stop_ids(c->format, all);
    for (int32_t i = 0; ids && i < n && i < capacity; i++) ids[i] = all[i];
    return n;
}

kite_sampling kite_chat_sampling_defaults(const kite_chat *c) {
    return c ? chat_format_sampling_defaults(c->format) : kite_sampling_default();
}

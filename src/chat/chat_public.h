/* What a kite_chat handle holds (kite.h): a chat format and the tokenizer it renders for. Internal. */
#ifndef KITE_CHAT_CHAT_PUBLIC_H
#define KITE_CHAT_CHAT_PUBLIC_H

#include "chat/chat_format.h"
#include "kite.h"
#include "tokenizer/tokenizer.h"

struct kite_chat {
    chat_format *format;
    const tokenizer *tokenizer; /* the model's, or owned_tokenizer */
    tokenizer *owned_tokenizer; /* loaded by kite_chat_load */
};

/* A kite_chat for DIR's chat format (its template, or the one at template_path when not NULL) on `borrowed` (or,
 * when NULL, on DIR's own tokenizer); *out NULL with KITE_OK when there is no chat template. */
kite_status chat_public_create(const char *dir, const char *template_path, const tokenizer *borrowed,
                               kite_chat **out);

#endif

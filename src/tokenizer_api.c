/* The tokenizer half of kite.h: a tokenizer loaded on its own, or borrowed from a model.
 *
 * A kite_tokenizer is the library's tokenizer (tokenizer/tokenizer.h) itself: the public name only hides its
 * layout, so a model can lend its tokenizer without a second object. */
#include <stdlib.h>

#include "kite.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

static const tokenizer *inner(const kite_tokenizer *t) { return (const tokenizer *)t; }

kite_status kite_tokenizer_load(const char *dir, kite_tokenizer **out) {
    if (!out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_tokenizer_load: no place for the result");
    *out = NULL;
    if (!dir) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_tokenizer_load: no directory given");
    tokenizer *t = NULL;
    kite_status status = tokenizer_load(dir, &t);
    if (status != KITE_OK) return status;
    *out = (kite_tokenizer *)t;
    return KITE_OK;
}

void kite_tokenizer_free(kite_tokenizer *t) { tokenizer_free((tokenizer *)t); }

const kite_tokenizer *kite_model_tokenizer(const kite_model *model) {
    return model ? (const kite_tokenizer *)model->tokenizer : NULL;
}

int32_t kite_tokenizer_vocab_size(const kite_tokenizer *t) { return t ? tokenizer_vocab_size(inner(t)) : 0; }

kite_status kite_tokenizer_encode(const kite_tokenizer *t, const char *text, size_t length, int32_t **ids,
                                  size_t *n_ids) {
    if (!ids || !n_ids)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_tokenizer_encode: no place for the ids");
    *ids = NULL;
    *n_ids = 0;
    if (!t) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_tokenizer_encode: no tokenizer given");
    return tokenizer_encode(inner(t), text, length, ids, n_ids);
}

kite_status kite_tokenizer_decode(const kite_tokenizer *t, const int32_t *ids, size_t n_ids, char **text,
                                  size_t *length) {
    if (!text || !length)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_tokenizer_decode: no place for the text");
    *text = NULL;
    *length = 0;
    if (!t) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_tokenizer_decode: no tokenizer given");
    if (!ids && n_ids > 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_tokenizer_decode: %zu ids but no array", n_ids);
    return tokenizer_decode(inner(t), ids, n_ids, text, length);
}

kite_status kite_tokenizer_token_bytes(const kite_tokenizer *t, int32_t id, const char **bytes, size_t *length) {
    if (!bytes || !length)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_tokenizer_token_bytes: no place for the bytes");
    *bytes = NULL;
    *length = 0;
    if (!t) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_tokenizer_token_bytes: no tokenizer given");
    const char *found = tokenizer_token_bytes(inner(t), id, length);
    if (!found) {
        *length = 0;
        return kite_fail(KITE_ERROR_INVALID_INPUT, "tokenizer: token id %d is not in the vocabulary (size %d)",
                         (int)id, tokenizer_vocab_size(inner(t)));
    }
    *bytes = found;
    return KITE_OK;
}

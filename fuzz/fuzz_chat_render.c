/* libFuzzer: a /v1/chat/completions request body rendered with Qwen3's chat template (tests/data/tokenizer's
 * tokenizer and template, read once). Any body is refused with a message or renders to a prompt whose ids are
 * all inside the vocabulary; never a crash, a leak or a hang. Seeded with the golden corpus's conversations. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/chat_format.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tokenizer *fuzz_tok;
static chat_format *fuzz_format;

static void fuzz_setup(void) {
    if (fuzz_format) return;
    /* This file is fuzz/fuzz_chat_render.c; the data sits in tests/data/tokenizer. */
    const char *file = __FILE__;
    const char *slash = strrchr(file, '/');
    const size_t n = slash ? (size_t)(slash - file) : 0;
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s%s../tests/data/tokenizer", (int)n, file, n ? "/" : "");
    if (tokenizer_load(dir, &fuzz_tok) != KITE_OK || chat_format_load(dir, fuzz_tok, &fuzz_format) != KITE_OK ||
        !fuzz_format) {
        fprintf(stderr, "fuzz_chat_render: %s\n", kite_last_error());
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_setup();
    kite_chat_prompt p;
    if (chat_format_render(fuzz_format, (const char *)data, size, &p) != KITE_OK) return 0;
    if (!p.text || p.text[p.length] != 0) __builtin_trap();
    for (size_t i = 0; i < p.n_ids; i++)
        if (p.ids[i] < 0 || p.ids[i] >= tokenizer_vocab_size(fuzz_tok)) __builtin_trap();
    free(p.text);
    free(p.ids);
    return 0;
}

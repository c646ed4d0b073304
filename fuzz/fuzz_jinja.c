/* libFuzzer: a chat template and its variables. The input is the template, a NUL byte, then a JSON document for
 * the variables (no NUL: the whole input is the template, rendered with no variables; JSON that does not parse
 * or is not an object is replaced by none). Whatever the bytes, parse and render must end in a status, never a
 * crash, a leak or a hang, and a successful render's length must be the string's. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    const char *split = memchr(text, '\0', size);
    size_t template_length = split ? (size_t)(split - text) : size;
    json_document *doc = NULL;
    if (split) doc = json_parse(split + 1, size - template_length - 1, NULL);
    const json_value *variables = doc && json_is_object(json_root(doc)) ? json_root(doc) : NULL;
    jinja_template *t = NULL;
    if (jinja_parse(text, template_length, "fuzz.jinja", &t) == KITE_OK) {
        char *out = NULL;
        size_t length = 0;
        if (jinja_render(t, variables, &out, &length) == KITE_OK) {
            if (!out || out[length] != '\0') __builtin_trap();
            free(out);
        } else if (out != NULL) {
            __builtin_trap();
        }
        jinja_free(t);
    } else if (t != NULL) {
        __builtin_trap();
    }
    json_free(doc);
    return 0;
}

/* Every chat template of tests/data/chat/templates rendering every request of tests/data/chat/conversations,
 * against what transformers' apply_chat_template gave for the same template and request
 * (tests/data/chat/goldens/TEMPLATE/NAME.txt and NAME.ids.json; NAME.error.txt when the template raised, then
 * kite must refuse with the template's message). tests/data/tools/make_chat_goldens.py made the goldens. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/chat_format.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "util/file.h"
#include "util/json.h"

#define CHAT_DATA KITE_TEST_DATA_DIR "/chat"
#define MAX_NAMES 256

typedef struct name_list {
    char *names[MAX_NAMES];
    int n;
} name_list;

static int compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The names in DIR ending with `suffix`, without it, sorted. */
static void list_names(const char *dir, const char *suffix, name_list *out) {
    out->n = 0;
    DIR *d = opendir(dir);
    CHECK_MSG(d != NULL, "cannot open %s", dir);
    if (!d) return;
    const size_t suffix_length = strlen(suffix);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        const size_t length = strlen(e->d_name);
        if (length <= suffix_length || strcmp(e->d_name + length - suffix_length, suffix) != 0) continue;
        if (out->n == MAX_NAMES) break;
        out->names[out->n++] = strndup(e->d_name, length - suffix_length);
    }
    closedir(d);
    qsort(out->names, (size_t)out->n, sizeof out->names[0], compare_names);
}

static void free_names(name_list *l) {
    for (int i = 0; i < l->n; i++) free(l->names[i]);
    l->n = 0;
}

/* DIR/NAME SUFFIX read whole, or NULL when it does not exist. */
static char *read_optional(const char *dir, const char *name, const char *suffix, size_t *length) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s%s", dir, name, suffix) >= (int)sizeof path) return NULL;
    if (!path_exists(path)) return NULL;
    char *text = NULL;
    CHECK_MSG(file_read_all(path, (size_t)64 << 20, KITE_ERROR_IO, &text, length) == KITE_OK, "%s", kite_last_error());
    return text;
}

static bool ids_match(const char *ids_json, size_t length, const int32_t *ids, size_t n_ids, const char *what) {
    json_document *d = json_parse(ids_json, length, NULL);
    const json_value *root = d ? json_root(d) : NULL;
    bool ok = json_is_array(root) && root->length == n_ids;
    for (size_t i = 0; ok && i < n_ids; i++) {
        int64_t id;
        ok = json_get_int64(&root->as.items[i], &id) && id == ids[i];
        if (!ok) fprintf(stderr, "    %s: id %zu is %d, transformers %lld\n", what, i, ids[i], (long long)id);
    }
    if (ok == false && root && json_is_array(root) && root->length != n_ids)
        fprintf(stderr, "    %s: %zu ids, transformers %zu\n", what, n_ids, root->length);
    json_free(d);
    return ok;
}

/* Where two texts first differ, for the failure message. */
static size_t first_difference(const char *a, size_t na, const char *b, size_t nb) {
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

static void test_corpus_renders_as_transformers(void) {
    tokenizer *tok = NULL;
    CHECK_MSG(tokenizer_load(KITE_TEST_DATA_DIR "/tokenizer", &tok) == KITE_OK, "%s", kite_last_error());
    if (!tok) return;
    name_list templates, conversations;
    list_names(CHAT_DATA "/templates", ".jinja", &templates);
    list_names(CHAT_DATA "/conversations", ".json", &conversations);
    CHECK_MSG(templates.n >= 4 && conversations.n >= 40, "%d templates, %d conversations", templates.n,
              conversations.n);
    int rendered = 0, refused = 0;
    for (int t = 0; t < templates.n; t++) {
        char template_path[2048], golden_dir[2048];
        snprintf(template_path, sizeof template_path, "%s/templates/%s.jinja", CHAT_DATA, templates.names[t]);
        snprintf(golden_dir, sizeof golden_dir, "%s/goldens/%s", CHAT_DATA, templates.names[t]);
        chat_format *f = NULL;
        const kite_status loaded = chat_format_load_template(KITE_TEST_DATA_DIR "/tokenizer", template_path, tok, &f);
        CHECK_MSG(loaded == KITE_OK && f, "%s: %s", templates.names[t], kite_last_error());
        if (!f) continue;
        for (int c = 0; c < conversations.n; c++) {
            const char *name = conversations.names[c];
            size_t request_length = 0, golden_length = 0, ids_length = 0, error_length = 0;
            char *request = read_optional(CHAT_DATA "/conversations", name, ".json", &request_length);
            char *golden = read_optional(golden_dir, name, ".txt", &golden_length);
            char *golden_ids = read_optional(golden_dir, name, ".ids.json", &ids_length);
            char *golden_error = read_optional(golden_dir, name, ".error.txt", &error_length);
            CHECK_MSG(request && (golden || golden_error), "%s/%s: no golden", templates.names[t], name);
            kite_chat_prompt p;
            const kite_status status = request ? chat_format_render(f, request, request_length, &p) : KITE_ERROR_IO;
            if (golden && request) {
                CHECK_MSG(status == KITE_OK, "%s/%s: %s", templates.names[t], name, kite_last_error());
                if (status == KITE_OK) {
                    const size_t at = first_difference(p.text, p.length, golden, golden_length);
                    CHECK_MSG(p.length == golden_length && at == golden_length,
                              "%s/%s: %zu bytes, transformers %zu; first difference at byte %zu: kite \"%.40s\" vs "
                              "\"%.40s\"",
                              templates.names[t], name, p.length, golden_length, at, p.text + at, golden + at);
                    if (golden_ids)
                        CHECK(ids_match(golden_ids, ids_length, p.ids, p.n_ids, name));
                    rendered++;
                    kite_chat_prompt_free(&p);
                }
            } else if (golden_error && request) {
                /* The template's own message, quoted (transformers prints "TemplateError: MESSAGE" or MESSAGE). */
                while (error_length > 0 && (golden_error[error_length - 1] == '\n')) golden_error[--error_length] = 0;
                const char *message = strstr(golden_error, ": ") ? strstr(golden_error, ": ") + 2 : golden_error;
                CHECK_MSG(status == KITE_ERROR_INVALID_INPUT && strstr(kite_last_error(), message),
                          "%s/%s: status %d, '%s'; transformers raised '%s'", templates.names[t], name, (int)status,
                          kite_last_error(), golden_error);
                if (status == KITE_OK) kite_chat_prompt_free(&p);
                refused++;
            }
            free(request);
            free(golden);
            free(golden_ids);
            free(golden_error);
        }
        chat_format_free(f);
    }
    printf("  %d renders byte-identical, %d refusals as transformers'\n", rendered, refused);
    free_names(&templates);
    free_names(&conversations);
    tokenizer_free(tok);
}

int main(void) {
    TEST_RUN(test_corpus_renders_as_transformers);
    return test_finish();
}

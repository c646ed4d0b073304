#include "weights/weight_cache_key.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint/safetensors.h"
#include "util/error.h"
#include "util/file.h"
#include "util/hash64.h"
#include "util/text_builder.h"
#include "weights/weight_cache.h"

/* config.json and the index are small; anything larger is not a checkpoint's (the checkpoint loader has
 * already read them under its own limits). */
#define KEY_MAX_TEXT_FILE_BYTES ((size_t)64 << 20)

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static kite_status file_stat(const char *path, struct stat *st) {
    if (stat(path, st) != 0)
        return kite_fail(KITE_ERROR_IO, "weight cache: cannot stat %s: %s", path, strerror(errno));
    return KITE_OK;
}

static void put_stat(text_builder *b, const char *name, const struct stat *st) {
    text_builder_printf(b, "file=%s size=%lld mtime=%lld.%09ld", name, (long long)st->st_size,
                        (long long)st->st_mtim.tv_sec, (long)st->st_mtim.tv_nsec);
}

/* "file=NAME size=... mtime=... hash=..." of a whole small file; nothing when `optional` and it is absent. */
static kite_status put_text_file(text_builder *b, const char *dir, const char *name, bool optional) {
    char *path = path_join(dir, name);
    if (!path) return KITE_ERROR_OUT_OF_MEMORY;
    kite_status status = KITE_OK;
    if (optional && !path_exists(path)) {
        free(path);
        return KITE_OK;
    }
    struct stat st;
    char *text = NULL;
    size_t length = 0;
    status = file_stat(path, &st);
    if (status == KITE_OK) status = file_read_all(path, KEY_MAX_TEXT_FILE_BYTES, KITE_ERROR_IO, &text, &length);
    if (status == KITE_OK) {
        put_stat(b, name, &st);
        text_builder_printf(b, " hash=%016llx\n", (unsigned long long)hash64(text, length));
    }
    free(text);
    free(path);
    return status;
}

static void put_field(text_builder *b, const char *field, const char *value) {
    text_builder_printf(b, "%s=%s\n", field, value);
}

static bool has_line_break(const char *text) { return strchr(text, '\n') || strchr(text, '\r'); }

kite_status weight_cache_key_make(const char *dir, const checkpoint *c, kite_weights weights,
                                  const char *backend_name, const char *arch, weight_cache_key *out) {
    *out = (weight_cache_key){0};
    char real[PATH_MAX];
    if (!realpath(dir, real))
        return kite_fail(KITE_ERROR_IO, "weight cache: cannot resolve the path of %s: %s", dir, strerror(errno));
    if (has_line_break(real) || has_line_break(backend_name) || has_line_break(arch))
        return kite_fail(KITE_ERROR_UNSUPPORTED, "weight cache: the model path %s holds a line break", real);
    text_builder b = {0};
    text_builder_printf(&b, "format=%d\n", WEIGHT_CACHE_FORMAT_VERSION);
    put_field(&b, "model", real);
    put_field(&b, "weights", weights == KITE_WEIGHTS_FP8 ? "fp8" : "bf16");
    put_field(&b, "backend", backend_name);
    put_field(&b, "arch", arch);
    /* The slot: what the entry is for, not which version of the checkpoint it holds. */
    uint64_t slot = hash64(b.data ? b.data : "", b.length);
    kite_status status = put_text_file(&b, dir, "config.json", false);
    if (status == KITE_OK) status = put_text_file(&b, dir, "model.safetensors.index.json", true);
    for (size_t i = 0; status == KITE_OK && i < checkpoint_file_count(c); i++) {
        const safetensors_file *file = checkpoint_file(c, i);
        const char *path = safetensors_name(file);
        struct stat st;
        status = file_stat(path, &st);
        if (status != KITE_OK) break;
        const void *header;
        size_t header_size;
        safetensors_header_bytes(file, &header, &header_size);
        if (!header) {
            status = kite_fail(KITE_ERROR_INVALID_ARGUMENT, "weight cache: %s is not mapped from a file", path);
            break;
        }
        put_stat(&b, base_name(path), &st);
        text_builder_printf(&b, " header=%016llx\n", (unsigned long long)hash64(header, header_size));
    }
    char *text = text_builder_take(&b, NULL);
    text_builder_free(&b);
    if (status != KITE_OK) {
        free(text);
        return status;
    }
    if (!text) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "weight cache: out of memory building the key");
    out->text = text;
    snprintf(out->slot, sizeof out->slot, "%016llx", (unsigned long long)slot);
    return KITE_OK;
}

void weight_cache_key_free(weight_cache_key *key) {
    free(key->text);
    key->text = NULL;
}

/* The line `index` of text: its start and length (without the newline); false past the end. */
static bool line_at(const char *text, size_t index, const char **start, size_t *length) {
    const char *p = text;
    for (size_t i = 0; i < index; i++) {
        p = strchr(p, '\n');
        if (!p) return false;
        p++;
    }
    if (!*p) return false;
    const char *end = strchr(p, '\n');
    *start = p;
    *length = end ? (size_t)(end - p) : strlen(p);
    return true;
}

bool weight_cache_key_field(const char *text, const char *field, char *out, size_t capacity) {
    size_t field_length = strlen(field);
    const char *line;
    size_t length;
    for (size_t i = 0; line_at(text, i, &line, &length); i++) {
        if (length > field_length && memcmp(line, field, field_length) == 0 && line[field_length] == '=') {
            snprintf(out, capacity, "%.*s", (int)(length - field_length - 1), line + field_length + 1);
            return true;
        }
    }
    return false;
}

/* The value part of a "field=value" line of `length` bytes ("" when it has no '='). */
static void line_value(const char *line, size_t length, const char **value, int *value_length) {
    const char *equals = memchr(line, '=', length);
    *value = equals ? equals + 1 : "";
    *value_length = equals ? (int)(length - (size_t)(equals + 1 - line)) : 0;
}

void weight_cache_key_explain(const char *found, const char *wanted, char *out, size_t capacity) {
    for (size_t i = 0;; i++) {
        const char *a = "", *b = "";
        size_t a_length = 0, b_length = 0;
        bool has_a = line_at(found, i, &a, &a_length), has_b = line_at(wanted, i, &b, &b_length);
        if (!has_a && !has_b) {
            snprintf(out, capacity, "its key differs");
            return;
        }
        if (has_a && has_b && a_length == b_length && memcmp(a, b, a_length) == 0) continue;
        const char *line = has_b ? b : a;
        size_t length = has_b ? b_length : a_length;
        const char *equals = memchr(line, '=', length);
        size_t field_length = equals ? (size_t)(equals - line) : length;
        if (field_length == 4 && memcmp(line, "file", 4) == 0) {
            /* The slot hash covers everything but the files: only the checkpoint changed. */
            const char *space = memchr(line, ' ', length);
            int name_length = (int)((space ? (size_t)(space - line) : length) - 5);
            snprintf(out, capacity, "stale: the checkpoint's %.*s changed since the entry was made", name_length,
                     line + 5);
            return;
        }
        const char *found_value, *wanted_value;
        int found_length, wanted_length;
        line_value(a, a_length, &found_value, &found_length);
        line_value(b, b_length, &wanted_value, &wanted_length);
        snprintf(out, capacity, "foreign: its %.*s is '%.*s', this load's is '%.*s'", (int)field_length, line,
                 found_length, found_value, wanted_length, wanted_value);
        return;
    }
}

/* The weight cache's folder: its default place, making it, and listing and clearing its entries (kite.h). */
#include "weights/weight_cache_folder.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"
#include "util/file.h"
#include "weights/weight_cache.h"
#include "weights/weight_cache_key.h"

kite_status kite_weight_cache_default_dir(char *out, size_t capacity) {
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    int n;
    /* The XDG base directory spec: a relative XDG_CACHE_HOME is invalid and ignored. */
    if (xdg && xdg[0] == '/') n = snprintf(out, capacity, "%s/kite", xdg);
    else if (home && home[0]) n = snprintf(out, capacity, "%s/.cache/kite", home);
    else return kite_fail(KITE_ERROR_IO, "weight cache: neither XDG_CACHE_HOME nor HOME is set");
    if (n < 0 || (size_t)n >= capacity) return kite_fail(KITE_ERROR_IO, "weight cache: the default folder's path is too long");
    return KITE_OK;
}

kite_status weight_cache_folder_make(const char *dir) {
    char path[4096];
    int n = snprintf(path, sizeof path, "%s", dir);
    if (n <= 0 || (size_t)n >= sizeof path) return kite_fail(KITE_ERROR_IO, "weight cache: folder path too long");
    /* mkdir -p: each missing parent, then the folder; an existing one is fine. Private: the entries say which
     * models a user runs. */
    for (char *p = path + 1;; p++) {
        bool end = *p == '\0';
        if (*p == '/' || end) {
            *p = '\0';
            if (mkdir(path, 0700) != 0 && errno != EEXIST)
                return kite_fail(KITE_ERROR_IO, "weight cache: cannot create the folder %s: %s", path, strerror(errno));
            if (end) break;
            *p = '/';
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return kite_fail(KITE_ERROR_IO, "weight cache: %s is not a folder", dir);
    return KITE_OK;
}

/* Whether name is an entry's ("<16 hex>.kwc"), or a fill's temporary file ("<16 hex>.kwc.tmp.*") when tmp. */
static bool is_entry_name(const char *name, bool tmp) {
    for (int i = 0; i < 16; i++)
        if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f'))) return false;
    const char *rest = name + 16;
    size_t suffix = strlen(WEIGHT_CACHE_SUFFIX);
    if (strncmp(rest, WEIGHT_CACHE_SUFFIX, suffix) != 0) return false;
    return tmp ? strncmp(rest + suffix, ".tmp.", 5) == 0 : rest[suffix] == '\0';
}

static kite_status resolve_dir(const char *dir, char *out, size_t capacity) {
    if (dir) {
        int n = snprintf(out, capacity, "%s", dir);
        if (n < 0 || (size_t)n >= capacity) return kite_fail(KITE_ERROR_IO, "weight cache: folder path too long");
        return KITE_OK;
    }
    return kite_weight_cache_default_dir(out, capacity);
}

static int compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The names in folder dir that pass keep(name), sorted; none when it does not exist. */
static kite_status folder_names(const char *dir, bool tmp_too, char ***names, size_t *n) {
    *names = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return KITE_OK;
        return kite_fail(KITE_ERROR_IO, "weight cache: cannot open the folder %s: %s", dir, strerror(errno));
    }
    size_t capacity = 0;
    kite_status status = KITE_OK;
    for (;;) {
        errno = 0;
        struct dirent *entry = readdir(d);
        if (!entry) {
            if (errno != 0) status = kite_fail(KITE_ERROR_IO, "weight cache: reading %s: %s", dir, strerror(errno));
            break;
        }
        if (!is_entry_name(entry->d_name, false) && !(tmp_too && is_entry_name(entry->d_name, true))) continue;
        if (*n == capacity) {
            capacity = capacity ? 2 * capacity : 16;
            char **grown = realloc(*names, capacity * sizeof *grown);
            if (!grown) {
                status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "weight cache: out of memory");
                break;
            }
            *names = grown;
        }
        (*names)[*n] = strdup(entry->d_name);
        if (!(*names)[*n]) {
            status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "weight cache: out of memory");
            break;
        }
        (*n)++;
    }
    if (closedir(d) != 0 && status == KITE_OK)
        status = kite_fail(KITE_ERROR_IO, "weight cache: closing %s: %s", dir, strerror(errno));
    if (status == KITE_OK && *n > 1) qsort(*names, *n, sizeof **names, compare_names);
    return status;
}

static void free_names(char **names, size_t n) {
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
}

void kite_weight_cache_list_free(kite_weight_cache_entry *entries, size_t n_entries) {
    if (!entries) return;
    for (size_t i = 0; i < n_entries; i++) {
        free((char *)entries[i].file);
        free((char *)entries[i].model);
        free((char *)entries[i].weights);
        free((char *)entries[i].backend);
        free((char *)entries[i].arch);
        free((char *)entries[i].problem);
    }
    free(entries);
}

static char *field_copy(const char *key, const char *field) {
    char value[4096] = "";
    if (key) weight_cache_key_field(key, field, value, sizeof value);
    return strdup(value);
}

kite_status kite_weight_cache_list(const char *dir, kite_weight_cache_entry **entries, size_t *n_entries) {
    if (!entries || !n_entries) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_weight_cache_list: NULL output");
    *entries = NULL;
    *n_entries = 0;
    char folder[4096];
    KITE_TRY(resolve_dir(dir, folder, sizeof folder));
    char **names;
    size_t n;
    KITE_TRY(folder_names(folder, false, &names, &n));
    kite_weight_cache_entry *out = n ? calloc(n, sizeof *out) : NULL;
    kite_status status = n && !out ? kite_fail(KITE_ERROR_OUT_OF_MEMORY, "weight cache: out of memory") : KITE_OK;
    for (size_t i = 0; status == KITE_OK && i < n; i++) {
        char *path = path_join(folder, names[i]);
        if (!path) {
            status = KITE_ERROR_OUT_OF_MEMORY;
            break;
        }
        weight_cache_entry *e = NULL;
        bool absent;
        kite_status opened = weight_cache_open(path, NULL, &absent, &e);
        kite_weight_cache_entry *row = &out[i];
        const char *key = opened == KITE_OK ? weight_cache_entry_key(e) : NULL;
        row->file = path;
        row->model = field_copy(key, "model");
        row->weights = field_copy(key, "weights");
        row->backend = field_copy(key, "backend");
        row->arch = field_copy(key, "arch");
        if (opened != KITE_OK) row->problem = strdup(kite_last_error());
        struct stat st;
        row->bytes = e ? weight_cache_entry_file_size(e) : (stat(path, &st) == 0 ? (uint64_t)st.st_size : 0);
        row->created = e ? weight_cache_entry_created(e) : 0;
        weight_cache_close(e);
        *n_entries = i + 1;
        if (!row->model || !row->weights || !row->backend || !row->arch || (opened != KITE_OK && !row->problem))
            status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "weight cache: out of memory");
    }
    free_names(names, n);
    if (status != KITE_OK) {
        kite_weight_cache_list_free(out, *n_entries);
        *n_entries = 0;
        return status;
    }
    *entries = out;
    return KITE_OK;
}

kite_status kite_weight_cache_clear(const char *dir, size_t *n_removed) {
    if (n_removed) *n_removed = 0;
    char folder[4096];
    KITE_TRY(resolve_dir(dir, folder, sizeof folder));
    char **names;
    size_t n;
    KITE_TRY(folder_names(folder, true, &names, &n));
    kite_status status = KITE_OK;
    for (size_t i = 0; status == KITE_OK && i < n; i++) {
        char *path = path_join(folder, names[i]);
        if (!path) {
            status = KITE_ERROR_OUT_OF_MEMORY;
            break;
        }
        /* Another process may have removed or replaced it meanwhile: gone is what clearing wants. */
        if (unlink(path) != 0 && errno != ENOENT)
            status = kite_fail(KITE_ERROR_IO, "weight cache: cannot remove %s: %s", path, strerror(errno));
        else if (n_removed)
            (*n_removed)++;
        free(path);
    }
    free_names(names, n);
    return status;
}

/* A copy of a test checkpoint with some weights made non-finite (NaN, +inf), for the tests that hold that a
 * non-finite logits row ends its request with an error on every path (greedy, sampled, logprobs, batched).
 *
 * poisoned_checkpoint_make copies every regular file of `from` into a new directory under $TMPDIR (or /tmp) and
 * sets `count` elements of tensor `tensor`, from element `first`, to `value` in the one .safetensors file (of one,
 * or of the shards) that holds it. The tensor
 * must be BF16 or F32. Returns the directory (free it with poisoned_checkpoint_remove) or NULL, saying why. */
#ifndef KITE_TEST_POISONED_CHECKPOINT_H
#define KITE_TEST_POISONED_CHECKPOINT_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"
#include "util/json.h"

static inline int poisoned_write_file(const char *path, const char *data, size_t length) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    const int ok = fwrite(data, 1, length, f) == length;
    return fclose(f) == 0 && ok;
}

/* Sets the elements in the safetensors bytes: 1 when done, -1 when this file has no such tensor, 0 (saying why)
 * when the file does not parse or the tensor is not BF16 / F32 or too short. */
static inline int poisoned_patch(char *bytes, size_t length, const char *tensor, size_t first, size_t count,
                                 float value) {
    uint64_t header = 0;
    if (length < 8) return 0;
    for (int i = 7; i >= 0; i--) header = header << 8 | (unsigned char)bytes[i];
    if (header > length - 8) return 0;
    json_document *d = json_parse(bytes + 8, (size_t)header, NULL);
    if (!d) {
        fprintf(stderr, "poisoned checkpoint: the safetensors header does not parse\n");
        return 0;
    }
    const json_value *entry = json_object_member(json_root(d), tensor);
    if (!entry) {
        json_free(d);
        return -1;
    }
    const json_value *dtype = entry ? json_object_member(entry, "dtype") : NULL;
    const json_value *offsets = entry ? json_object_member(entry, "data_offsets") : NULL;
    int64_t begin = 0, end = 0;
    const int found = json_is_string(dtype) && json_is_array(offsets) && offsets->length == 2 &&
                      json_get_int64(&offsets->as.items[0], &begin) && json_get_int64(&offsets->as.items[1], &end);
    const size_t element = found && strcmp(dtype->as.string, "BF16") == 0 ? 2
                           : found && strcmp(dtype->as.string, "F32") == 0 ? 4 : 0;
    json_free(d);
    if (element == 0 || begin < 0 || end < begin || (uint64_t)end > length - 8 - header ||
        (first + count) * element > (size_t)(end - begin)) {
        fprintf(stderr, "poisoned checkpoint: %s is missing, not BF16 / F32, or has fewer than %zu elements\n", tensor,
                first + count);
        return 0;
    }
    uint32_t bits;
    memcpy(&bits, &value, 4);
    char *at = bytes + 8 + header + (size_t)begin + first * element;
    for (size_t i = 0; i < count; i++) { /* little-endian; BF16 is the float's upper half */
        for (size_t b = 0; b < element; b++) at[i * element + b] = (char)(bits >> (8 * (b + 4 - element)));
    }
    return 1;
}

static inline char *poisoned_checkpoint_make(const char *from, const char *tensor, size_t first, size_t count,
                                             float value) {
    const char *tmp = getenv("TMPDIR");
    char *dir = malloc(4096);
    if (!dir) return NULL;
    snprintf(dir, 4096, "%s/kite-poisoned-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "poisoned checkpoint: cannot make %s\n", dir);
        free(dir);
        return NULL;
    }
    DIR *source = opendir(from);
    int ok = source != NULL, patched = 0;
    for (struct dirent *e; ok && (e = readdir(source)) != NULL;) {
        char in[4096], out[4096];
        struct stat st;
        snprintf(in, sizeof in, "%s/%s", from, e->d_name);
        if (stat(in, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        snprintf(out, sizeof out, "%s/%s", dir, e->d_name);
        size_t length = 0;
        char *data = test_read_file(in, &length);
        ok = data != NULL;
        const size_t name_length = strlen(e->d_name);
        if (ok && name_length > 12 && strcmp(e->d_name + name_length - 12, ".safetensors") == 0) {
            const int done = poisoned_patch(data, length, tensor, first, count, value);
            ok = done != 0;
            patched += done == 1;
        }
        if (ok) ok = poisoned_write_file(out, data, length);
        free(data);
    }
    if (source) closedir(source);
    if (!ok || patched != 1) {
        fprintf(stderr, "poisoned checkpoint: cannot copy %s to %s with %s patched in exactly one shard\n", from, dir,
                tensor);
        free(dir);
        return NULL;
    }
    return dir;
}

static inline void poisoned_checkpoint_remove(char *dir) {
    if (!dir) return;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0) fprintf(stderr, "poisoned checkpoint: cannot remove %s\n", path);
    }
    if (d) closedir(d);
    if (rmdir(dir) != 0) fprintf(stderr, "poisoned checkpoint: cannot remove %s\n", dir);
    free(dir);
}

#endif

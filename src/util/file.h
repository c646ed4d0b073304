/* Files: path joining, whole-file reads and read-only mappings, with failures reported through
 * kite_fail() naming the path. Shared by the checkpoint and tokenizer loaders. */
#ifndef KITE_UTIL_FILE_H
#define KITE_UTIL_FILE_H

#include <stdbool.h>
#include <stddef.h>

#include "kite.h"

/* Returns "dir/name" (malloc'd) or NULL when out of memory (the message is recorded). */
char *path_join(const char *dir, const char *name);

/* Whether `path` names something that exists (any type); errors other than "absent" count as existing,
 * so the caller's open reports them. */
bool path_exists(const char *path);

/* Every open goes through one check: the path is opened without blocking (a FIFO would otherwise wait
 * for a writer forever) and anything but a regular file (FIFO, directory, device, socket) is refused
 * with KITE_ERROR_IO and a message naming the path and what it is. */

/* Reads a whole regular file into a NUL-terminated malloc'd buffer. A file over max_size is refused
 * with `too_large_status` (a config.json of gigabytes is not a real one); open/read failures are
 * KITE_ERROR_IO. */
kite_status file_read_all(const char *path, size_t max_size, kite_status too_large_status, char **out,
                          size_t *length);

/* A whole regular file mapped read-only. An empty file gives data NULL and size 0. */
typedef struct file_mapping {
    const void *data;
    size_t size;
} file_mapping;

/* Maps the file; `prefault` reads it in up front (for files that are about to be read through, such as
 * tokenizer.json) instead of page by page. A file over max_size is refused with `too_large_status`
 * before anything is mapped or read. */
kite_status file_map(const char *path, bool prefault, size_t max_size, kite_status too_large_status,
                     file_mapping *out);
void file_unmap(file_mapping *mapping);

#endif

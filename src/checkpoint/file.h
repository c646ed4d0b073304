/* Small file helpers shared by the checkpoint loaders: path joining and whole-file reads.
 * Failures are reported through kite_fail() naming the path. */
#ifndef KITE_CHECKPOINT_FILE_H
#define KITE_CHECKPOINT_FILE_H

#include <stddef.h>

#include "kite.h"

/* Returns "dir/name" (malloc'd) or NULL when out of memory (the message is recorded). */
char *checkpoint_path_join(const char *dir, const char *name);

/* Whether `path` names something that exists (any type); errors other than "absent" count as existing,
 * so the caller's open reports them. */
int checkpoint_path_exists(const char *path);

/* Reads the whole regular file into a NUL-terminated malloc'd buffer. Files over max_size are
 * KITE_ERROR_INVALID_CHECKPOINT (a config or index that large is not a real one); open/read failures
 * KITE_ERROR_IO. */
kite_status checkpoint_read_file(const char *path, size_t max_size, char **out, size_t *length);

#endif

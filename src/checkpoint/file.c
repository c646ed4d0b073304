#include "checkpoint/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"

char *checkpoint_path_join(const char *dir, const char *name) {
    size_t dir_length = strlen(dir);
    size_t name_length = strlen(name);
    /* A trailing slash on the directory is common on command lines; avoid "dir//name" in messages. */
    int need_slash = dir_length > 0 && dir[dir_length - 1] != '/';
    char *path = malloc(dir_length + (size_t)need_slash + name_length + 1);
    if (!path) {
        kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory joining a path", dir);
        return NULL;
    }
    memcpy(path, dir, dir_length);
    if (need_slash) path[dir_length] = '/';
    memcpy(path + dir_length + need_slash, name, name_length + 1);
    return path;
}

int checkpoint_path_exists(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0) return 1;
    return errno != ENOENT && errno != ENOTDIR;
}

kite_status checkpoint_read_file(const char *path, size_t max_size, char **out, size_t *length) {
    *out = NULL;
    *length = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kite_fail(KITE_ERROR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        kite_status status = kite_fail(KITE_ERROR_IO, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return status;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return kite_fail(KITE_ERROR_IO, "%s: not a regular file", path);
    }
    if (st.st_size < 0 || (uint64_t)st.st_size > (uint64_t)max_size) {
        close(fd);
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: file is %lld bytes, more than the %zu allowed", path,
                         (long long)st.st_size, max_size);
    }
    size_t size = (size_t)st.st_size;
    char *buffer = malloc(size + 1);
    if (!buffer) {
        close(fd);
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory reading %zu bytes", path, size);
    }
    size_t done = 0;
    while (done < size) {
        ssize_t got = read(fd, buffer + done, size - done);
        if (got < 0) {
            if (errno == EINTR) continue;
            kite_status status = kite_fail(KITE_ERROR_IO, "%s: read failed: %s", path, strerror(errno));
            free(buffer);
            close(fd);
            return status;
        }
        if (got == 0) break; /* the file shrank while we read it */
        done += (size_t)got;
    }
    if (close(fd) != 0) {
        free(buffer);
        return kite_fail(KITE_ERROR_IO, "%s: close failed: %s", path, strerror(errno));
    }
    if (done != size) {
        free(buffer);
        return kite_fail(KITE_ERROR_IO, "%s: read %zu of %zu bytes (file changed while reading?)", path, done, size);
    }
    buffer[size] = '\0';
    *out = buffer;
    *length = size;
    return KITE_OK;
}

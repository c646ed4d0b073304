#include "util/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"

char *path_join(const char *dir, const char *name) {
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

bool path_exists(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0) return true;
    return errno != ENOENT && errno != ENOTDIR;
}

/* What a non-regular file is, for the refusal message. */
static const char *file_kind_name(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a plain file";
}

/* Opens a regular file and returns its descriptor and size; -1 after recording the failure. O_NONBLOCK
 * keeps open() itself from waiting for a writer when the path is a FIFO (or a device that blocks), so
 * the type check after fstat() is reached for every path; it is cleared again before the file is read. */
static int open_regular(const char *path, size_t *size, kite_status *status) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        *status = kite_fail(KITE_ERROR_IO, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        *status = kite_fail(KITE_ERROR_IO, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        *status = kite_fail(KITE_ERROR_IO, "%s: is not a regular file (%s)", path, file_kind_name(st.st_mode));
        close(fd);
        return -1;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        *status = kite_fail(KITE_ERROR_IO, "%s: cannot clear O_NONBLOCK: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (st.st_size < 0 || (uint64_t)st.st_size > (uint64_t)SIZE_MAX / 2) {
        *status = kite_fail(KITE_ERROR_IO, "%s: file size %lld cannot be handled", path, (long long)st.st_size);
        close(fd);
        return -1;
    }
    *size = (size_t)st.st_size;
    return fd;
}

kite_status file_read_all(const char *path, size_t max_size, kite_status too_large_status, char **out,
                          size_t *length) {
    *out = NULL;
    *length = 0;
    kite_status status = KITE_OK;
    size_t size = 0;
    int fd = open_regular(path, &size, &status);
    if (fd < 0) return status;
    if (size > max_size) {
        close(fd);
        return kite_fail(too_large_status, "%s: file is %zu bytes, more than the %zu allowed", path, size, max_size);
    }
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
            status = kite_fail(KITE_ERROR_IO, "%s: read failed: %s", path, strerror(errno));
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

kite_status file_map(const char *path, bool prefault, size_t max_size, kite_status too_large_status,
                     file_mapping *out) {
    out->data = NULL;
    out->size = 0;
    kite_status status = KITE_OK;
    size_t size = 0;
    int fd = open_regular(path, &size, &status);
    if (fd < 0) return status;
    if (size > max_size) { /* checked before mapping, so a refusal reads nothing (a sparse file stays unread) */
        close(fd);
        return kite_fail(too_large_status, "%s: file is %zu bytes, more than the %zu allowed", path, size, max_size);
    }
    if (size == 0) { /* mmap of an empty file fails; an empty mapping says the same */
        close(fd);
        return KITE_OK;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE | (prefault ? MAP_POPULATE : 0), fd, 0);
    int map_errno = errno;
    if (close(fd) != 0 && map != MAP_FAILED) {
        status = kite_fail(KITE_ERROR_IO, "%s: close failed: %s", path, strerror(errno));
        munmap(map, size);
        return status;
    }
    if (map == MAP_FAILED) return kite_fail(KITE_ERROR_IO, "%s: mmap failed: %s", path, strerror(map_errno));
    out->data = map;
    out->size = size;
    return KITE_OK;
}

void file_unmap(file_mapping *mapping) {
    if (mapping->data) (void)munmap((void *)mapping->data, mapping->size); /* nothing useful to do on failure */
    mapping->data = NULL;
    mapping->size = 0;
}

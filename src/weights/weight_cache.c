#include "weights/weight_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/error.h"
#include "util/hash64.h"
#include "weights/weight_cache_key.h"

static const unsigned char MAGIC[8] = {'K', 'I', 'T', 'E', 'W', 'C', 'E', '\0'};
#define PROLOGUE_BYTES 32

typedef struct entry_segment {
    backend_segment segment;
    uint64_t offset;
    const unsigned char *hashes; /* n_chunks u64, in the header */
} entry_segment;

struct weight_cache_entry {
    char *path;
    int fd;
    unsigned char *header; /* the header block */
    uint64_t header_size;
    int64_t created;
    uint64_t file_size;
    uint64_t chunk_bytes;
    char *key;
    int32_t n_segments;
    entry_segment *segments;
    backend_segment *plain; /* the segments as the backend sees them */
    load_progress *progress;
};

/* ---- little-endian fields ---------------------------------------------------------------------------- */

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static uint64_t chunk_count(uint64_t size, uint64_t chunk) { return size / chunk + (size % chunk != 0); }
static uint64_t align_up(uint64_t v) { return (v + WEIGHT_CACHE_ALIGN - 1) / WEIGHT_CACHE_ALIGN * WEIGHT_CACHE_ALIGN; }

/* ---- file I/O, every call checked ---------------------------------------------------------------------- */

static kite_status write_all_at(int fd, const void *data, size_t size, uint64_t offset, const char *path) {
    const unsigned char *p = data;
    while (size > 0) {
        ssize_t n = pwrite(fd, p, size, (off_t)offset);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            return kite_fail(KITE_ERROR_IO, "weight cache: cannot write %s: %s", path,
                             n < 0 ? strerror(errno) : "no progress");
        p += n;
        size -= (size_t)n;
        offset += (uint64_t)n;
    }
    return KITE_OK;
}

static kite_status read_all_at(int fd, void *data, size_t size, uint64_t offset, const char *path) {
    unsigned char *p = data;
    while (size > 0) {
        ssize_t n = pread(fd, p, size, (off_t)offset);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return kite_fail(KITE_ERROR_IO, "weight cache: cannot read %s: %s", path, strerror(errno));
        if (n == 0) return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "truncated: %s ends early", path);
        p += n;
        size -= (size_t)n;
        offset += (uint64_t)n;
    }
    return KITE_OK;
}

/* The folder part of path ("." when it has none), into out. */
static void folder_of(const char *path, char *out, size_t capacity) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, capacity, ".");
    else if (slash == path) snprintf(out, capacity, "/");
    else snprintf(out, capacity, "%.*s", (int)(slash - path), path);
}

static kite_status fsync_folder(const char *path) {
    char folder[4096];
    folder_of(path, folder, sizeof folder);
    int fd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return kite_fail(KITE_ERROR_IO, "weight cache: cannot open %s: %s", folder, strerror(errno));
    int rc = fsync(fd);
    int saved = errno;
    if (close(fd) != 0 && rc == 0) return kite_fail(KITE_ERROR_IO, "weight cache: closing %s: %s", folder, strerror(errno));
    if (rc != 0) return kite_fail(KITE_ERROR_IO, "weight cache: cannot fsync %s: %s", folder, strerror(saved));
    return KITE_OK;
}

/* ---- writing ---------------------------------------------------------------------------------------------- */

static kite_status write_entry(int fd, const char *tmp_path, const char *key, backend *b, load_progress *progress) {
    const uint64_t chunk = WEIGHT_CACHE_CHUNK_BYTES;
    int32_t n = 0;
    KITE_TRY(b->segments->list_segments(b, NULL, 0, &n));
    if (n <= 0 || n > WEIGHT_CACHE_MAX_SEGMENTS)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "weight cache: the backend lists %d segments", (int)n);
    backend_segment *segments = calloc((size_t)n, sizeof *segments);
    uint64_t *offsets = calloc((size_t)n, sizeof *offsets);
    unsigned char *header = NULL, *buffer = NULL;
    kite_status status = KITE_OK;
    if (!segments || !offsets) status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "weight cache: out of memory");
    int32_t listed = n;
    if (status == KITE_OK) status = b->segments->list_segments(b, segments, n, &listed);
    if (status == KITE_OK && listed != n)
        status = kite_fail(KITE_ERROR_INVALID_ARGUMENT, "weight cache: the backend's segment count changed");
    /* The header's size is known before any data: names, sizes and the number of chunks. */
    const size_t key_size = strlen(key);
    if (key_size > UINT32_MAX) status = kite_fail(KITE_ERROR_INVALID_ARGUMENT, "weight cache: the key is too long");
    uint64_t header_size = 8 + 8 + 8 + 4 + key_size + 4, data_bytes = 0;
    for (int32_t i = 0; status == KITE_OK && i < n; i++) {
        size_t name_size = strnlen(segments[i].name, sizeof segments[i].name);
        if (name_size == 0 || name_size == sizeof segments[i].name)
            status = kite_fail(KITE_ERROR_INVALID_ARGUMENT, "weight cache: segment %d has no usable name", (int)i);
        header_size += 4 + name_size + 8 + 8 + 8 * chunk_count(segments[i].size, chunk);
        data_bytes += segments[i].size;
    }
    if (status == KITE_OK && header_size > WEIGHT_CACHE_MAX_HEADER_BYTES)
        status = kite_fail(KITE_ERROR_UNSUPPORTED, "weight cache: a header of %llu bytes is past the limit",
                           (unsigned long long)header_size);
    uint64_t offset = align_up(PROLOGUE_BYTES + header_size);
    for (int32_t i = 0; status == KITE_OK && i < n; i++) {
        offsets[i] = offset;
        offset = align_up(offset + segments[i].size);
    }
    const uint64_t file_size = n > 0 && status == KITE_OK ? offsets[n - 1] + segments[n - 1].size : 0;
    if (status == KITE_OK) {
        header = calloc(1, PROLOGUE_BYTES + (size_t)header_size);
        buffer = malloc((size_t)chunk);
        if (!header || !buffer) status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "weight cache: out of memory");
    }
    unsigned char *h = header ? header + PROLOGUE_BYTES : NULL;
    if (status == KITE_OK) {
        time_t now = time(NULL);
        put_u64(h, (uint64_t)(now == (time_t)-1 ? 0 : now));
        put_u64(h + 8, file_size);
        put_u64(h + 16, chunk);
        put_u32(h + 24, (uint32_t)key_size);
        memcpy(h + 28, key, key_size);
        put_u32(h + 28 + key_size, (uint32_t)n);
    }
    unsigned char *cursor = h ? h + 28 + key_size + 4 : NULL;
    load_progress_begin(progress, KITE_LOAD_STAGE_CACHE_FILL, data_bytes);
    for (int32_t i = 0; status == KITE_OK && i < n; i++) {
        size_t name_size = strlen(segments[i].name);
        put_u32(cursor, (uint32_t)name_size);
        memcpy(cursor + 4, segments[i].name, name_size);
        put_u64(cursor + 4 + name_size, offsets[i]);
        put_u64(cursor + 12 + name_size, segments[i].size);
        cursor += 20 + name_size;
        for (uint64_t at = 0; status == KITE_OK && at < segments[i].size; at += chunk) {
            size_t size = (size_t)(segments[i].size - at < chunk ? segments[i].size - at : chunk);
            status = b->segments->read_segment(b, i, at, buffer, size);
            if (status == KITE_OK) {
                put_u64(cursor, hash64(buffer, size));
                cursor += 8;
                status = write_all_at(fd, buffer, size, offsets[i] + at, tmp_path);
            }
            if (status == KITE_OK) load_progress_advance(progress, size);
        }
    }
    if (status == KITE_OK) {
        memcpy(header, MAGIC, sizeof MAGIC);
        put_u32(header + 8, WEIGHT_CACHE_FORMAT_VERSION);
        put_u32(header + 12, 0);
        put_u64(header + 16, header_size);
        put_u64(header + 24, hash64(h, (size_t)header_size));
        status = write_all_at(fd, header, PROLOGUE_BYTES + (size_t)header_size, 0, tmp_path);
    }
    /* A last segment shorter than its alignment leaves no hole: the file ends at its last byte. */
    if (status == KITE_OK && ftruncate(fd, (off_t)file_size) != 0)
        status = kite_fail(KITE_ERROR_IO, "weight cache: cannot size %s: %s", tmp_path, strerror(errno));
    if (status == KITE_OK && fsync(fd) != 0)
        status = kite_fail(KITE_ERROR_IO, "weight cache: cannot fsync %s: %s", tmp_path, strerror(errno));
    if (status == KITE_OK) load_progress_end(progress);
    free(segments);
    free(offsets);
    free(header);
    free(buffer);
    return status;
}

kite_status weight_cache_write(const char *path, const char *key, backend *b, load_progress *progress) {
    if (!b->segments || !b->segments->list_segments || !b->segments->read_segment)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "weight cache: the %s backend does not export its weights",
                         b->ops->name);
    static unsigned counter; /* tells apart two fills of one process; the pid tells processes apart */
    struct timespec t;
    if (clock_gettime(CLOCK_REALTIME, &t) != 0) t.tv_nsec = 0;
    size_t length = strlen(path) + 64;
    char *tmp_path = malloc(length);
    if (!tmp_path) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "weight cache: out of memory");
    snprintf(tmp_path, length, "%s.tmp.%ld.%u.%ld", path, (long)getpid(), __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED),
             (long)t.tv_nsec);
    int fd = open(tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        kite_status status =
            kite_fail(KITE_ERROR_IO, "weight cache: cannot create %s: %s", tmp_path, strerror(errno));
        free(tmp_path);
        return status;
    }
    kite_status status = write_entry(fd, tmp_path, key, b, progress);
    if (close(fd) != 0 && status == KITE_OK)
        status = kite_fail(KITE_ERROR_IO, "weight cache: cannot close %s: %s", tmp_path, strerror(errno));
    if (status == KITE_OK && rename(tmp_path, path) != 0)
        status = kite_fail(KITE_ERROR_IO, "weight cache: cannot rename %s to %s: %s", tmp_path, path, strerror(errno));
    if (status != KITE_OK) {
        /* The partial file is ours: removing it keeps the folder clean; a failure here changes nothing more. */
        (void)unlink(tmp_path);
    } else {
        status = fsync_folder(path);
    }
    free(tmp_path);
    return status;
}

/* ---- reading ---------------------------------------------------------------------------------------------- */

void weight_cache_close(weight_cache_entry *e) {
    if (!e) return;
    if (e->fd >= 0) (void)close(e->fd); /* read-only: nothing to lose */
    free(e->path);
    free(e->header);
    free(e->key);
    free(e->segments);
    free(e->plain);
    free(e);
}

/* Bytes left in the header from cursor, as a bounds check for every field read. */
#define HEADER_LEFT(e, cursor) ((e)->header_size - (uint64_t)((cursor) - (e)->header))

static kite_status damaged(const char *what) { return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "damaged: %s", what); }

static kite_status parse_header(weight_cache_entry *e) {
    const unsigned char *p = e->header;
    if (e->header_size < 28) return damaged("the header is too short");
    e->created = (int64_t)get_u64(p);
    uint64_t file_size = get_u64(p + 8);
    e->chunk_bytes = get_u64(p + 16);
    uint64_t key_size = get_u32(p + 24);
    if (file_size != e->file_size)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "truncated: the file holds %llu bytes, its header says %llu",
                         (unsigned long long)e->file_size, (unsigned long long)file_size);
    if (e->chunk_bytes < WEIGHT_CACHE_ALIGN || e->chunk_bytes > ((uint64_t)1 << 30) ||
        e->chunk_bytes % WEIGHT_CACHE_ALIGN != 0)
        return damaged("the chunk size is not a multiple of 4 KiB up to 1 GiB");
    p += 28;
    if (HEADER_LEFT(e, p) < 4 || key_size > HEADER_LEFT(e, p) - 4) return damaged("the key runs past the header");
    e->key = malloc((size_t)key_size + 1);
    if (!e->key) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "weight cache: out of memory");
    memcpy(e->key, p, (size_t)key_size);
    e->key[key_size] = '\0';
    if (strlen(e->key) != key_size) return damaged("the key holds a NUL byte");
    p += key_size;
    uint64_t n = get_u32(p);
    p += 4;
    /* Each segment takes at least 21 header bytes: the count is bounded by what the header holds. */
    if (n == 0 || n > WEIGHT_CACHE_MAX_SEGMENTS || n > HEADER_LEFT(e, p) / 21)
        return damaged("the segment count does not fit the header");
    e->n_segments = (int32_t)n;
    e->segments = calloc((size_t)n, sizeof *e->segments);
    e->plain = calloc((size_t)n, sizeof *e->plain);
    if (!e->segments || !e->plain) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "weight cache: out of memory");
    uint64_t previous_end = PROLOGUE_BYTES + e->header_size;
    for (uint64_t i = 0; i < n; i++) {
        if (HEADER_LEFT(e, p) < 4) return damaged("a segment runs past the header");
        uint64_t name_size = get_u32(p);
        p += 4;
        if (name_size == 0 || name_size >= BACKEND_SEGMENT_NAME_MAX || HEADER_LEFT(e, p) < name_size + 16)
            return damaged("a segment name has a bad size");
        entry_segment *s = &e->segments[i];
        memcpy(s->segment.name, p, (size_t)name_size);
        s->segment.name[name_size] = '\0';
        if (strlen(s->segment.name) != name_size) return damaged("a segment name holds a NUL byte");
        p += name_size;
        s->offset = get_u64(p);
        s->segment.size = get_u64(p + 8);
        p += 16;
        if (s->offset % WEIGHT_CACHE_ALIGN != 0 || s->offset < previous_end || s->offset > e->file_size ||
            s->segment.size > e->file_size - s->offset)
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                             "damaged: segment %s at [%llu, +%llu) overlaps another or leaves the file (%llu bytes)",
                             s->segment.name, (unsigned long long)s->offset, (unsigned long long)s->segment.size,
                             (unsigned long long)e->file_size);
        previous_end = s->offset + s->segment.size;
        uint64_t n_chunks = chunk_count(s->segment.size, e->chunk_bytes);
        if (n_chunks > HEADER_LEFT(e, p) / 8) return damaged("a segment's checksums run past the header");
        s->hashes = p;
        p += 8 * n_chunks;
        for (uint64_t j = 0; j < i; j++)
            if (strcmp(e->segments[j].segment.name, s->segment.name) == 0)
                return damaged("two segments share a name");
        e->plain[i] = s->segment;
    }
    if (HEADER_LEFT(e, p) != 0) return damaged("the header has trailing bytes");
    return KITE_OK;
}

kite_status weight_cache_open(const char *path, const char *key, bool *absent, weight_cache_entry **out) {
    *out = NULL;
    *absent = false;
    weight_cache_entry *e = calloc(1, sizeof *e);
    if (!e) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "weight cache: out of memory");
    e->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    e->path = strdup(path);
    kite_status status = KITE_OK;
    if (e->fd < 0) {
        *absent = errno == ENOENT;
        status = kite_fail(KITE_ERROR_IO, "cannot open it: %s", strerror(errno));
    }
    if (status == KITE_OK && !e->path) status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "weight cache: out of memory");
    struct stat st;
    if (status == KITE_OK && fstat(e->fd, &st) != 0)
        status = kite_fail(KITE_ERROR_IO, "cannot stat it: %s", strerror(errno));
    if (status == KITE_OK && !S_ISREG(st.st_mode)) status = kite_fail(KITE_ERROR_IO, "it is not a regular file");
    unsigned char prologue[PROLOGUE_BYTES];
    if (status == KITE_OK) {
        e->file_size = (uint64_t)st.st_size;
        if (e->file_size < PROLOGUE_BYTES)
            status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "truncated: %llu bytes",
                               (unsigned long long)e->file_size);
    }
    if (status == KITE_OK) status = read_all_at(e->fd, prologue, sizeof prologue, 0, path);
    if (status == KITE_OK && memcmp(prologue, MAGIC, sizeof MAGIC) != 0)
        status = damaged("it does not start with a weight cache entry's magic");
    if (status == KITE_OK && get_u32(prologue + 8) != WEIGHT_CACHE_FORMAT_VERSION)
        status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "stale: cache format version %u, this kite writes %d",
                           get_u32(prologue + 8), WEIGHT_CACHE_FORMAT_VERSION);
    if (status == KITE_OK) {
        e->header_size = get_u64(prologue + 16);
        /* Checked against the real file before it sizes an allocation (a damaged size asks for nothing). */
        if (e->header_size > WEIGHT_CACHE_MAX_HEADER_BYTES || e->header_size > e->file_size - PROLOGUE_BYTES)
            status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: a header of %llu bytes in a file of %llu",
                               e->header_size > WEIGHT_CACHE_MAX_HEADER_BYTES ? "damaged" : "truncated",
                               (unsigned long long)e->header_size, (unsigned long long)e->file_size);
    }
    if (status == KITE_OK) {
        e->header = malloc(e->header_size ? (size_t)e->header_size : 1);
        if (!e->header) status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "weight cache: out of memory");
    }
    if (status == KITE_OK) status = read_all_at(e->fd, e->header, (size_t)e->header_size, PROLOGUE_BYTES, path);
    if (status == KITE_OK && hash64(e->header, (size_t)e->header_size) != get_u64(prologue + 24))
        status = damaged("the header's checksum does not match");
    if (status == KITE_OK) status = parse_header(e);
    if (status == KITE_OK && key && strcmp(e->key, key) != 0) {
        char why[512];
        weight_cache_key_explain(e->key, key, why, sizeof why);
        status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s", why);
    }
    if (status != KITE_OK) {
        weight_cache_close(e);
        return status;
    }
    *out = e;
    return KITE_OK;
}

const char *weight_cache_entry_key(const weight_cache_entry *e) { return e->key; }
int64_t weight_cache_entry_created(const weight_cache_entry *e) { return e->created; }
uint64_t weight_cache_entry_file_size(const weight_cache_entry *e) { return e->file_size; }

uint64_t weight_cache_entry_data_bytes(const weight_cache_entry *e) {
    uint64_t total = 0;
    for (int32_t i = 0; i < e->n_segments; i++) total += e->segments[i].segment.size;
    return total;
}

/* The threads one read uses, and the chunks one call checks at once (a read of more goes in slices). */
#define WEIGHT_CACHE_READ_THREADS 8
#define WEIGHT_CACHE_READ_MAX_CHUNKS 64

static kite_status entry_read(const backend_segment_source *source, int32_t index, uint64_t offset, void *dst,
                              size_t size) {
    weight_cache_entry *e = source->context;
    if (index < 0 || index >= e->n_segments)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "weight cache: segment %d does not exist", (int)index);
    const entry_segment *s = &e->segments[index];
    const uint64_t chunk = e->chunk_bytes;
    if (offset % chunk != 0 || offset > s->segment.size || size > s->segment.size - offset ||
        (size % chunk != 0 && offset + size != s->segment.size))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "weight cache: segment %s: a read of [%llu, +%zu) does not cover whole chunks of %llu",
                         s->segment.name, (unsigned long long)offset, size, (unsigned long long)chunk);
    /* Chunks are read and checked on several threads: one thread's pread from the page cache plus XXH64 runs at
     * ~2 GB/s, a third of what a pinned upload takes. Each chunk's outcome is kept and the first failure, in file
     * order, is reported afterwards (kite_fail is not called from the worker threads). */
    unsigned char *out = dst;
    const int64_t n_chunks = (int64_t)((size + chunk - 1) / chunk);
    enum { CHUNK_OK, CHUNK_IO_ERROR, CHUNK_TRUNCATED, CHUNK_DAMAGED };
    int outcome[WEIGHT_CACHE_READ_MAX_CHUNKS];
    int read_errno[WEIGHT_CACHE_READ_MAX_CHUNKS];
    if (n_chunks > WEIGHT_CACHE_READ_MAX_CHUNKS) {
        /* Larger reads go in slices of at most WEIGHT_CACHE_READ_MAX_CHUNKS chunks. */
        const uint64_t slice = (uint64_t)WEIGHT_CACHE_READ_MAX_CHUNKS * chunk;
        for (uint64_t at = 0; at < size; at += slice)
            KITE_TRY(entry_read(source, index, offset + at, out + at, (size_t)(size - at < slice ? size - at : slice)));
        return KITE_OK;
    }
    const int threads = (int)(n_chunks < WEIGHT_CACHE_READ_THREADS ? n_chunks : WEIGHT_CACHE_READ_THREADS);
#pragma omp parallel for schedule(static, 1) num_threads(threads)
    for (int64_t k = 0; k < n_chunks; k++) {
        const uint64_t at = (uint64_t)k * chunk;
        const size_t piece = (size_t)(size - at < chunk ? size - at : chunk);
        outcome[k] = CHUNK_OK;
        unsigned char *p = out + at;
        uint64_t file_at = s->offset + offset + at;
        for (size_t left = piece; left > 0 && outcome[k] == CHUNK_OK;) {
            ssize_t n = pread(e->fd, p, left, (off_t)file_at);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) {
                outcome[k] = CHUNK_IO_ERROR;
                read_errno[k] = errno;
            } else if (n == 0) {
                outcome[k] = CHUNK_TRUNCATED;
            } else {
                p += n;
                left -= (size_t)n;
                file_at += (uint64_t)n;
            }
        }
        if (outcome[k] == CHUNK_OK && hash64(out + at, piece) != get_u64(s->hashes + 8 * ((offset + at) / chunk)))
            outcome[k] = CHUNK_DAMAGED;
    }
    for (int64_t k = 0; k < n_chunks; k++) {
        const uint64_t at = (uint64_t)k * chunk;
        const size_t piece = (size_t)(size - at < chunk ? size - at : chunk);
        switch (outcome[k]) {
        case CHUNK_OK:
            break;
        case CHUNK_IO_ERROR:
            return kite_fail(KITE_ERROR_IO, "weight cache: cannot read %s: %s", e->path, strerror(read_errno[k]));
        case CHUNK_TRUNCATED:
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "truncated: %s ends early", e->path);
        default:
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "damaged: segment %s: bytes [%llu, +%zu) fail their checksum",
                             s->segment.name, (unsigned long long)(offset + at), piece);
        }
    }
    load_progress_advance(e->progress, size);
    return KITE_OK;
}

backend_segment_source weight_cache_entry_source(weight_cache_entry *e, load_progress *progress) {
    e->progress = progress;
    return (backend_segment_source){.n_segments = e->n_segments, .segments = e->plain, .chunk_bytes = e->chunk_bytes,
                                    .read = entry_read, .context = e};
}

/* Byte-level BPE: the byte <-> symbol tables, the vocab and merge hash maps, and merging one piece by
 * merge rank with a min-heap of candidate pairs (O(n log n) for a piece of n bytes), behind a per-thread
 * cache of recently merged pieces. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer_internal.h"
#include "util/error.h"

/* ---- byte-level symbols --------------------------------------------------------------------------- */

/* GPT-2's table: printable Latin-1 bytes stand for themselves, the other 68 bytes get the code points
 * from U+0100 on, in byte order. */
static bool byte_is_printable(int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); }

void byte_level_tables(uint32_t byte_to_char[256]) {
    uint32_t next = 0x100;
    for (int b = 0; b < 256; b++) byte_to_char[b] = byte_is_printable(b) ? (uint32_t)b : next++;
}

enum { BYTE_LEVEL_MAX_CHAR = 0x100 + 68 };

static int16_t char_to_byte_table[BYTE_LEVEL_MAX_CHAR];
static pthread_once_t char_to_byte_once = PTHREAD_ONCE_INIT;

static void char_to_byte_init(void) {
    uint32_t byte_to_char[256];
    byte_level_tables(byte_to_char);
    for (int c = 0; c < BYTE_LEVEL_MAX_CHAR; c++) char_to_byte_table[c] = -1;
    for (int b = 0; b < 256; b++) char_to_byte_table[byte_to_char[b]] = (int16_t)b;
}

bool byte_level_decode(const char *s, size_t length, char *out, size_t *out_length) {
    (void)pthread_once(&char_to_byte_once, char_to_byte_init);
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < length;) {
        uint32_t c;
        if (u[i] < 0x80) {
            c = u[i];
            i += 1;
        } else if ((u[i] & 0xE0) == 0xC0 && i + 1 < length && (u[i + 1] & 0xC0) == 0x80) {
            c = (uint32_t)(u[i] & 0x1F) << 6 | (u[i + 1] & 0x3F);
            i += 2;
        } else {
            return false; /* every byte-level symbol is below U+0800 */
        }
        if (c >= BYTE_LEVEL_MAX_CHAR || char_to_byte_table[c] < 0) return false;
        out[o++] = (char)char_to_byte_table[c];
    }
    *out_length = o;
    return true;
}

/* ---- hashing -------------------------------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ULL;
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ULL;
    x ^= x >> 32;
    return x;
}

uint64_t bytes_hash(const void *data, size_t length) {
    const unsigned char *p = data;
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (length * 0xff51afd7ed558ccdULL);
    while (length >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ mix64(w)) * 0x9E3779B97F4A7C15ULL;
        p += 8;
        length -= 8;
    }
    uint64_t tail = 0;
    for (size_t i = 0; i < length; i++) tail |= (uint64_t)p[i] << (8 * i);
    h = (h ^ mix64(tail ^ 0x5bd1e995)) * 0x9E3779B97F4A7C15ULL;
    return mix64(h);
}

int32_t bytes_map_find(const tokenizer *t, const char *bytes, size_t length) {
    const bytes_map *m = &t->vocab;
    uint64_t h = bytes_hash(bytes, length);
    uint32_t tag = (uint32_t)(h >> 32);
    size_t i = (size_t)h & m->mask;
    for (;;) {
        const bytes_slot *s = &m->slots[i];
        if (s->id < 0) return -1;
        if (s->tag == tag) {
            uint32_t start = t->offsets[s->id], end = t->offsets[s->id + 1];
            if (end - start == length && memcmp(t->blob + start, bytes, length) == 0) return s->id;
        }
        i = (i + 1) & m->mask;
    }
}

bool bytes_map_insert(tokenizer *t, int32_t id) {
    bytes_map *m = &t->vocab;
    const char *bytes = t->blob + t->offsets[id];
    size_t length = t->offsets[id + 1] - t->offsets[id];
    uint64_t h = bytes_hash(bytes, length);
    uint32_t tag = (uint32_t)(h >> 32);
    size_t i = (size_t)h & m->mask;
    for (;;) {
        bytes_slot *s = &m->slots[i];
        if (s->id < 0) {
            s->id = id;
            s->tag = tag;
            return true;
        }
        if (s->tag == tag) {
            uint32_t start = t->offsets[s->id], end = t->offsets[s->id + 1];
            if (end - start == length && memcmp(t->blob + start, bytes, length) == 0) return false;
        }
        i = (i + 1) & m->mask;
    }
}

uint64_t merge_hash(uint64_t key) { return mix64(key); }

static inline bool merge_find(const merge_map *m, int32_t left, int32_t right, uint64_t *value) {
    uint64_t key = ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
    size_t i = (size_t)mix64(key) & m->mask;
    for (;;) {
        const merge_entry *e = &m->entries[i];
        if (e->key == key) {
            *value = e->value;
            return true;
        }
        if (e->key == 0) return false;
        i = (i + 1) & m->mask;
    }
}

/* ---- id buffer ------------------------------------------------------------------------------------ */

kite_status id_buffer_reserve(id_buffer *b, size_t extra) {
    if (b->capacity - b->count >= extra) return KITE_OK;
    size_t cap = b->capacity ? b->capacity : 64;
    while (cap - b->count < extra) {
        if (cap > SIZE_MAX / 2 / sizeof(int32_t)) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "tokenizer: too many ids");
        cap *= 2;
    }
    int32_t *grown = realloc(b->ids, cap * sizeof(int32_t));
    if (!grown) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory for ids");
    b->ids = grown;
    b->capacity = cap;
    return KITE_OK;
}

kite_status id_buffer_push(id_buffer *b, int32_t id) {
    if (b->count == b->capacity) KITE_TRY(id_buffer_reserve(b, 1));
    b->ids[b->count++] = id;
    return KITE_OK;
}

/* ---- per-thread piece cache ----------------------------------------------------------------------- */

/* Text repeats words constantly, so most pieces were merged before. The cache is per thread, so a shared
 * tokenizer needs no lock; it holds pieces of one tokenizer at a time (its generation) and is emptied
 * wholesale when full, which is cheap and keeps the hot words of the current text. */
enum {
    CACHE_SLOTS = 1 << 15,
    CACHE_MAX_ENTRIES = CACHE_SLOTS / 2,
    CACHE_ARENA_BYTES = 2 << 20,
    CACHE_MAX_PIECE = 128, /* longer pieces are rare and cheap to merge relative to their length */
};

typedef struct cache_slot {
    uint64_t hash;
    uint32_t offset;     /* into arena: the piece bytes, then n_ids int32 (4-byte aligned) */
    uint16_t key_length;
    uint16_t n_ids;      /* 0: empty slot */
} cache_slot;

typedef struct piece_cache {
    uint64_t generation;
    uint32_t count;
    uint32_t arena_used;
    cache_slot slots[CACHE_SLOTS];
    unsigned char arena[CACHE_ARENA_BYTES];
} piece_cache;

static pthread_key_t cache_key;
static bool cache_key_ok;
static pthread_once_t cache_key_once = PTHREAD_ONCE_INIT;

static void cache_destroy(void *cache) { free(cache); }

static void cache_key_init(void) { cache_key_ok = pthread_key_create(&cache_key, cache_destroy) == 0; }

static void cache_clear(piece_cache *c, uint64_t generation) {
    memset(c->slots, 0, sizeof c->slots);
    c->count = 0;
    c->arena_used = 0;
    c->generation = generation;
}

/* This thread's cache, or NULL when none can be had (then pieces are merged every time). */
static piece_cache *cache_get(const tokenizer *t) {
    if (pthread_once(&cache_key_once, cache_key_init) != 0 || !cache_key_ok) return NULL;
    piece_cache *c = pthread_getspecific(cache_key);
    if (!c) {
        c = malloc(sizeof *c);
        if (!c) return NULL;
        if (pthread_setspecific(cache_key, c) != 0) {
            free(c);
            return NULL;
        }
        cache_clear(c, t->generation);
    }
    if (c->generation != t->generation) cache_clear(c, t->generation);
    return c;
}

static const cache_slot *cache_find(const piece_cache *c, uint64_t hash, const char *piece, size_t length) {
    size_t i = (size_t)hash & (CACHE_SLOTS - 1);
    for (;;) {
        const cache_slot *s = &c->slots[i];
        if (s->n_ids == 0) return NULL;
        if (s->hash == hash && s->key_length == length && memcmp(c->arena + s->offset, piece, length) == 0) return s;
        i = (i + 1) & (CACHE_SLOTS - 1);
    }
}

static void cache_insert(piece_cache *c, uint64_t hash, const char *piece, size_t length, const int32_t *ids,
                         size_t n_ids) {
    size_t key_bytes = (length + 3) & ~(size_t)3;
    size_t need = key_bytes + n_ids * sizeof(int32_t);
    if (c->count >= CACHE_MAX_ENTRIES || c->arena_used + need > CACHE_ARENA_BYTES) cache_clear(c, c->generation);
    size_t i = (size_t)hash & (CACHE_SLOTS - 1);
    while (c->slots[i].n_ids != 0) i = (i + 1) & (CACHE_SLOTS - 1);
    cache_slot *s = &c->slots[i];
    s->hash = hash;
    s->offset = c->arena_used;
    s->key_length = (uint16_t)length;
    s->n_ids = (uint16_t)n_ids;
    memcpy(c->arena + c->arena_used, piece, length);
    memcpy(c->arena + c->arena_used + key_bytes, ids, n_ids * sizeof(int32_t));
    c->arena_used += (uint32_t)need;
    c->count++;
}

/* ---- merging -------------------------------------------------------------------------------------- */

/* Heap entries pack (rank << 32 | position): the smallest is the lowest rank, and among equal ranks the
 * leftmost, which is the order Hugging Face merges in. */
static inline void heap_push(uint64_t *heap, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (heap[parent] <= v) break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = v;
}

static inline uint64_t heap_pop(uint64_t *heap, size_t *n) {
    uint64_t top = heap[0];
    uint64_t last = heap[--(*n)];
    size_t i = 0, count = *n;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= count) break;
        if (child + 1 < count && heap[child + 1] < heap[child]) child++;
        if (heap[child] >= last) break;
        heap[i] = heap[child];
        i = child;
    }
    if (count > 0) heap[i] = last;
    return top;
}

enum { BPE_STACK_SYMBOLS = 256 };

/* Merges bytes piece[0..n) into ids written to result (n of room); returns how many. */
static size_t bpe_merge(const tokenizer *t, const unsigned char *piece, size_t n, int32_t *ids, int32_t *next,
                        int32_t *prev, uint64_t *heap, int32_t *result) {
    size_t heap_count = 0;
    for (size_t i = 0; i < n; i++) {
        ids[i] = t->byte_to_id[piece[i]];
        next[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        prev[i] = (int32_t)i - 1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        uint64_t value;
        if (merge_find(&t->merges, ids[i], ids[i + 1], &value))
            heap_push(heap, &heap_count, (value & 0xFFFFFFFF00000000ULL) | i);
    }
    while (heap_count > 0) {
        uint64_t top = heap_pop(heap, &heap_count);
        uint32_t rank = (uint32_t)(top >> 32);
        size_t pos = (size_t)(top & 0xFFFFFFFFu);
        /* Stale entries: the left symbol was merged away, or either side changed since the push. */
        if (ids[pos] < 0 || next[pos] < 0) continue;
        size_t right = (size_t)next[pos];
        uint64_t value;
        if (!merge_find(&t->merges, ids[pos], ids[right], &value) || (uint32_t)(value >> 32) != rank) continue;
        ids[pos] = (int32_t)(value & 0xFFFFFFFFu);
        ids[right] = -1;
        next[pos] = next[right];
        if (next[pos] >= 0) prev[next[pos]] = (int32_t)pos;
        if (prev[pos] >= 0) {
            size_t left = (size_t)prev[pos];
            if (merge_find(&t->merges, ids[left], ids[pos], &value))
                heap_push(heap, &heap_count, (value & 0xFFFFFFFF00000000ULL) | left);
        }
        if (next[pos] >= 0) {
            if (merge_find(&t->merges, ids[pos], ids[next[pos]], &value))
                heap_push(heap, &heap_count, (value & 0xFFFFFFFF00000000ULL) | pos);
        }
    }
    size_t count = 0;
    for (int32_t i = 0; i >= 0; i = next[i]) result[count++] = ids[i];
    return count;
}

kite_status bpe_encode_piece(const tokenizer *t, const char *piece, size_t length, id_buffer *out) {
    if (length == 0) return KITE_OK;
    if (length == 1) return id_buffer_push(out, t->byte_to_id[(unsigned char)piece[0]]);
    if (t->ignore_merges) {
        int32_t id = bytes_map_find(t, piece, length);
        if (id >= 0) return id_buffer_push(out, id);
    }
    if (length > UINT32_MAX / 2) return kite_fail(KITE_ERROR_INVALID_INPUT, "tokenizer: piece too long");

    piece_cache *cache = length <= CACHE_MAX_PIECE ? cache_get(t) : NULL;
    uint64_t hash = 0;
    if (cache) {
        hash = bytes_hash(piece, length);
        const cache_slot *hit = cache_find(cache, hash, piece, length);
        if (hit) {
            KITE_TRY(id_buffer_reserve(out, hit->n_ids));
            memcpy(out->ids + out->count, cache->arena + hit->offset + ((hit->key_length + 3u) & ~3u),
                   hit->n_ids * sizeof(int32_t));
            out->count += hit->n_ids;
            return KITE_OK;
        }
    }

    KITE_TRY(id_buffer_reserve(out, length));
    int32_t stack_ids[BPE_STACK_SYMBOLS], stack_next[BPE_STACK_SYMBOLS], stack_prev[BPE_STACK_SYMBOLS];
    uint64_t stack_heap[3 * BPE_STACK_SYMBOLS];
    int32_t *ids = stack_ids, *next = stack_next, *prev = stack_prev;
    uint64_t *heap = stack_heap;
    void *block = NULL;
    if (length > BPE_STACK_SYMBOLS) {
        /* Each merge pushes at most two pairs, so the heap never holds more than 3n entries. */
        if (length > SIZE_MAX / (3 * sizeof(int32_t) + 3 * sizeof(uint64_t)))
            return kite_fail(KITE_ERROR_INVALID_INPUT, "tokenizer: piece too long");
        block = malloc(length * (3 * sizeof(int32_t) + 3 * sizeof(uint64_t)));
        if (!block) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory merging a piece");
        heap = block;
        ids = (int32_t *)(heap + 3 * length);
        next = ids + length;
        prev = next + length;
    }
    int32_t *result = out->ids + out->count;
    size_t n_ids = bpe_merge(t, (const unsigned char *)piece, length, ids, next, prev, heap, result);
    free(block);
    if (cache && n_ids <= UINT16_MAX) cache_insert(cache, hash, piece, length, result, n_ids);
    out->count += n_ids;
    return KITE_OK;
}

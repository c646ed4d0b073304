/* One safetensors file: a valid one reads back, and each rule of the format is enforced with a message
 * naming file, tensor and field; hostile headers are refused before they are parsed, in little memory. Also
 * the dtype conversions of model/qwen3.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint/safetensors.h"
#include "checkpoint_writer.h"
#include "test_util.h"
#include "util/error.h"

/* An in-memory file: 8-byte little-endian header length, the header, then data_size bytes. */
typedef struct image {
    unsigned char bytes[8192];
    size_t size;
} image;

static void image_build(image *im, const char *header, size_t data_size) {
    size_t header_length = strlen(header);
    for (int i = 0; i < 8; i++) im->bytes[i] = (unsigned char)((uint64_t)header_length >> (8 * i));
    memcpy(im->bytes + 8, header, header_length);
    memset(im->bytes + 8 + header_length, 0x11, data_size);
    im->size = 8 + header_length + data_size;
}

static kite_status parse_header(const char *header, size_t data_size) {
    static image im;
    image_build(&im, header, data_size);
    safetensors_file *file = NULL;
    kite_status status = safetensors_parse_memory(im.bytes, im.size, "x/model.safetensors", &file);
    CHECK((status == KITE_OK) == (file != NULL));
    safetensors_close(file);
    return status;
}

static void expect(kite_status status, kite_status expected, const char *substring, int line) {
    bool ok = status == expected && strstr(kite_last_error(), substring) != NULL;
    if (!ok)
        fprintf(stderr, "  line %d: wanted status %d with \"%s\", got %d: %s\n", line, expected, substring, status,
                kite_last_error());
    CHECK(ok);
}
#define EXPECT(status, expected, substring) expect(status, expected, substring, __LINE__)
#define EXPECT_DAMAGED(header, data_size, substring)                                                                   \
    EXPECT(parse_header(header, data_size), KITE_ERROR_INVALID_CHECKPOINT, substring)

static void test_valid_file(void) {
    static image im;
    image_build(&im,
                "{\"__metadata__\":{\"format\":\"pt\"},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},"
                "\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
                "\"empty\":{\"dtype\":\"F16\",\"shape\":[0,5],\"data_offsets\":[12,12]},"
                "\"scalar\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[12,16]}}  ",
                16);
    safetensors_file *file = NULL;
    CHECK(safetensors_parse_memory(im.bytes, im.size, "mem", &file) == KITE_OK);
    if (!file) return;
    CHECK(safetensors_count(file) == 4);
    CHECK(strcmp(safetensors_tensor_at(file, 0)->name, "a") == 0); /* name order */
    CHECK(safetensors_tensor_at(file, 4) == NULL);
    const safetensors_tensor *b = safetensors_find(file, "b");
    CHECK(b && b->dtype == TENSOR_DTYPE_F32 && b->n_dims == 1 && b->shape[0] == 2);
    size_t data_start = im.size - 16;
    CHECK(b && b->data == im.bytes + data_start + 4);
    const safetensors_tensor *scalar = safetensors_find(file, "scalar");
    CHECK(scalar && scalar->n_dims == 0 && scalar->data_end - scalar->data_begin == 4);
    CHECK(safetensors_find(file, "missing") == NULL);
    CHECK(safetensors_find(file, "__metadata__") == NULL);
    CHECK(safetensors_metadata_get(file, "format") && strcmp(safetensors_metadata_get(file, "format"), "pt") == 0);
    CHECK(strcmp(safetensors_name(file), "mem") == 0);
    safetensors_close(file);

    /* No tensors at all is a valid (empty) file. */
    CHECK(parse_header("{}", 0) == KITE_OK);
    CHECK(parse_header("{\"__metadata__\":{}}", 0) == KITE_OK);
}

static void test_header_length(void) {
    safetensors_file *file = NULL;
    unsigned char bytes[64] = {0};
    EXPECT(safetensors_parse_memory(bytes, 0, "x/model.safetensors", &file), KITE_ERROR_INVALID_CHECKPOINT,
           "x/model.safetensors: file is 0 bytes");
    EXPECT(safetensors_parse_memory(bytes, 7, "x/model.safetensors", &file), KITE_ERROR_INVALID_CHECKPOINT, "7 bytes");
    CHECK(file == NULL);
    /* Header length huge: 2^40. */
    memset(bytes, 0, sizeof bytes);
    bytes[5] = 1;
    EXPECT(safetensors_parse_memory(bytes, sizeof bytes, "x/model.safetensors", &file), KITE_ERROR_INVALID_CHECKPOINT,
           "exceeds the limit");
    /* Just over the 100 MB limit, and the largest u64. */
    uint64_t over = SAFETENSORS_MAX_HEADER_BYTES + 1;
    for (int i = 0; i < 8; i++) bytes[i] = (unsigned char)(over >> (8 * i));
    EXPECT(safetensors_parse_memory(bytes, sizeof bytes, "x", &file), KITE_ERROR_INVALID_CHECKPOINT,
           "exceeds the limit");
    memset(bytes, 0xff, 8);
    EXPECT(safetensors_parse_memory(bytes, sizeof bytes, "x", &file), KITE_ERROR_INVALID_CHECKPOINT,
           "exceeds the limit");
    /* Past the end of the file. */
    memset(bytes, 0, 8);
    bytes[0] = 57; /* 8 + 57 > 64 */
    EXPECT(safetensors_parse_memory(bytes, sizeof bytes, "x", &file), KITE_ERROR_INVALID_CHECKPOINT,
           "runs past the end of the file");
    bytes[0] = 1;
    EXPECT(safetensors_parse_memory(bytes, sizeof bytes, "x", &file), KITE_ERROR_INVALID_CHECKPOINT, "minimum of 2");
    CHECK(file == NULL);
}

static void test_header_json(void) {
    EXPECT_DAMAGED("not json", 0, "not valid JSON");
    EXPECT_DAMAGED("{\"a\":", 0, "not valid JSON");
    EXPECT_DAMAGED("[1,2]", 0, "must be a JSON object");
    EXPECT_DAMAGED("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}\x01", 4, "not valid JSON");
    EXPECT_DAMAGED("{\"a\xff\":{}}", 0, "not valid JSON"); /* not UTF-8 */
    EXPECT_DAMAGED("{\"a\":5}", 0, "tensor a: entry must be an object");
    EXPECT_DAMAGED("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__");
    EXPECT_DAMAGED("{\"__metadata__\":[]}", 0, "__metadata__");
    EXPECT_DAMAGED("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "byte 19: duplicate key \"__metadata__\"");
    /* a field twice in one entry: Python's json (safetensors' own reader keeps the last too) would read F16 */
    EXPECT_DAMAGED("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"dtype\":\"F16\",\"data_offsets\":[0,4]}}", 4,
                   "duplicate key \"dtype\"");
    EXPECT_DAMAGED("{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, "control character");
    EXPECT_DAMAGED("{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                   "\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[4,8]}}",
                   8, "duplicate key \"a\"");
}

static void test_fields(void) {
    EXPECT_DAMAGED("{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor t: field dtype");
    EXPECT_DAMAGED("{\"t\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                   "tensor t: field dtype \"Q4\"");
    EXPECT_DAMAGED("{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "tensor t: field shape");
    EXPECT_DAMAGED("{\"t\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "tensor t: field shape[0]");
    EXPECT_DAMAGED("{\"t\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "field shape[0]");
    EXPECT_DAMAGED("{\"t\":{\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[0,4]}}", 4, "field shape");
    EXPECT_DAMAGED("{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor t: field data_offsets");
    EXPECT_DAMAGED("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "field data_offsets");
    EXPECT_DAMAGED("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4, "field data_offsets");
    EXPECT_DAMAGED("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, "field data_offsets");
    EXPECT_DAMAGED("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8, "begin after end");
    EXPECT(parse_header("{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4),
           KITE_ERROR_UNSUPPORTED, "9 dimensions");
}

static void test_unsupported_dtypes(void) {
    EXPECT(parse_header("{\"w\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16),
           KITE_ERROR_UNSUPPORTED, "x/model.safetensors: tensor w: dtype F64");
    EXPECT(parse_header("{\"w\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8), KITE_ERROR_UNSUPPORTED,
           "tensor w: dtype I64");
    EXPECT(parse_header("{\"w\":{\"dtype\":\"F8_E5M2\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3),
           KITE_ERROR_UNSUPPORTED, "dtype F8_E5M2");
    /* F8_E4M3 is read (checkpoint.c decides where it may appear). */
    EXPECT(parse_header("{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3), KITE_OK, "");
    /* Damage elsewhere wins over an unsupported dtype: the file is broken, not merely foreign. */
    EXPECT_DAMAGED("{\"w\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 20, "trailing bytes");
    /* F4 packs two per byte: an odd count is not a whole number of bytes. */
    EXPECT_DAMAGED("{\"w\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, "whole number of bytes");
}

static void test_spans(void) {
    /* Shape disagreeing with the byte span. */
    EXPECT_DAMAGED("{\"model.layers.0.mlp.up_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[96,32],"
                   "\"data_offsets\":[0,100]}}",
                   100,
                   "x/model.safetensors: tensor model.layers.0.mlp.up_proj.weight: data_offsets [0, 100] span 100 "
                   "bytes but shape [96, 32] x BF16 needs 6144");
    /* Overflowing shapes. */
    EXPECT_DAMAGED("{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0,
                   "overflows");
    EXPECT_DAMAGED("{\"t\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0,
                   "overflows");
    /* A zero dimension makes any product zero, overflow or not. */
    CHECK(parse_header("{\"t\":{\"dtype\":\"F32\",\"shape\":[0,9223372036854775807],\"data_offsets\":[0,0]}}", 0) ==
          KITE_OK);
    /* Overlap. */
    EXPECT_DAMAGED("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                   12, "tensor b: data_offsets [4, 12] overlap tensor a [0, 8]");
    EXPECT_DAMAGED("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                   8, "overlap");
    /* An empty tensor inside another one's span also breaks the tiling. */
    EXPECT_DAMAGED("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}",
                   8, "overlap");
    /* Past the end of the data area. */
    EXPECT_DAMAGED("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
                   "tensor a: data_offsets [0, 8] run past the end of the data area (4 bytes)");
    EXPECT_DAMAGED(
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[9223372036854775807,9223372036854775807]}}", 0,
        "past the end");
    /* Holes: at the start, and between tensors. */
    EXPECT_DAMAGED("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                   "tensor a: data_offsets [4, 8] leave a hole of 4 bytes");
    EXPECT_DAMAGED("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                   12, "tensor b: data_offsets [8, 12] leave a hole");
    /* Trailing bytes. */
    EXPECT_DAMAGED("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 5, "1 trailing bytes");
    EXPECT_DAMAGED("{}", 3, "3 trailing bytes");
}

static void test_files(void) {
    char *dir = checkpoint_writer_make_temp_dir();
    CHECK(dir != NULL);
    if (!dir) return;
    char *path = checkpoint_writer_path(dir, "model.safetensors");
    safetensors_file *file = NULL;

    EXPECT(safetensors_open(path, &file), KITE_ERROR_IO, "cannot open");
    CHECK(strstr(kite_last_error(), path) != NULL);
    EXPECT(safetensors_open(dir, &file), KITE_ERROR_IO, "not a regular file");

    CHECK(checkpoint_writer_write_file(path, "", 0));
    EXPECT(safetensors_open(path, &file), KITE_ERROR_INVALID_CHECKPOINT, "file is 0 bytes");
    CHECK(strstr(kite_last_error(), path) != NULL);

    checkpoint_writer_tensor tensors[2] = {
        {.name = "w", .dtype = "BF16", .n_dims = 2, .shape = {3, 5}},
        {.name = "n", .dtype = "F32", .n_dims = 1, .shape = {5}},
    };
    CHECK(checkpoint_writer_write_safetensors(path, tensors, 2, 7));
    CHECK(safetensors_open(path, &file) == KITE_OK);
    if (file) {
        const safetensors_tensor *w = safetensors_find(file, "w");
        CHECK(w && w->shape[0] == 3 && w->shape[1] == 5 && w->dtype == TENSOR_DTYPE_BF16);
        uint16_t expected[15];
        checkpoint_writer_fill("w", "BF16", 15, 7, expected);
        CHECK(w && memcmp(w->data, expected, sizeof expected) == 0);
        safetensors_close(file);
        file = NULL;
    }

    /* Truncate the valid file by a few bytes: the last tensor now runs past the end. */
    size_t size = 0;
    char *bytes = test_read_file(path, &size);
    CHECK(bytes != NULL);
    if (bytes) {
        CHECK(checkpoint_writer_write_file(path, bytes, size - 3));
        EXPECT(safetensors_open(path, &file), KITE_ERROR_INVALID_CHECKPOINT, "past the end of the data area");
        CHECK(strstr(kite_last_error(), path) != NULL);
        /* Cut inside the header. */
        CHECK(checkpoint_writer_write_file(path, bytes, 20));
        EXPECT(safetensors_open(path, &file), KITE_ERROR_INVALID_CHECKPOINT, "runs past the end of the file");
        free(bytes);
    }
    CHECK(file == NULL);
    free(path);
    CHECK(checkpoint_writer_remove_dir(dir));
    free(dir);
}

/* Every prefix and many single-byte corruptions of a valid image must be rejected or accepted cleanly. */
static void test_corruptions_never_crash(void) {
    static image im;
    image_build(&im,
                "{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                12);
    for (size_t cut = 0; cut < im.size; cut++) {
        safetensors_file *file = NULL;
        CHECK(safetensors_parse_memory(im.bytes, cut, "cut", &file) != KITE_OK);
        CHECK(file == NULL);
    }
    static const unsigned char replacements[] = {0, '"', '{', '}', '[', ']', ',', '9', '-', 0xff};
    for (size_t at = 0; at < im.size; at++) {
        unsigned char saved = im.bytes[at];
        for (size_t r = 0; r < sizeof replacements; r++) {
            im.bytes[at] = replacements[r];
            safetensors_file *file = NULL;
            kite_status status = safetensors_parse_memory(im.bytes, im.size, "flip", &file);
            CHECK((status == KITE_OK) == (file != NULL));
            safetensors_close(file);
        }
        im.bytes[at] = saved;
    }
}

/* A heap image of a header made of head, `count` copies of item joined by commas, then tail. */
static unsigned char *hostile_image(const char *head, const char *item, size_t count, const char *tail,
                                    size_t *size) {
    size_t head_length = strlen(head), item_length = strlen(item), tail_length = strlen(tail);
    size_t header_length = head_length + count * (item_length + 1) - 1 + tail_length;
    unsigned char *bytes = malloc(8 + header_length);
    if (!bytes) return NULL;
    for (int i = 0; i < 8; i++) bytes[i] = (unsigned char)((uint64_t)header_length >> (8 * i));
    unsigned char *cursor = bytes + 8;
    memcpy(cursor, head, head_length);
    cursor += head_length;
    for (size_t i = 0; i < count; i++) {
        if (i > 0) *cursor++ = ',';
        memcpy(cursor, item, item_length);
        cursor += item_length;
    }
    memcpy(cursor, tail, tail_length);
    *size = 8 + header_length;
    return bytes;
}

/* Parses the image in a child process and returns how much the child's peak RSS grew (KiB), or -1 when the
 * child did not report; *refused says whether the parse failed with `expected` and `substring`. */
static long refusal_peak_kib(const unsigned char *bytes, size_t size, kite_status expected, const char *substring,
                             bool *refused) {
    *refused = false;
    int fds[2];
    if (pipe(fds) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        struct rusage before, after;
        getrusage(RUSAGE_SELF, &before);
        safetensors_file *file = NULL;
        kite_status status = safetensors_parse_memory(bytes, size, "hostile.safetensors", &file);
        getrusage(RUSAGE_SELF, &after);
        long grown = after.ru_maxrss - before.ru_maxrss;
        bool as_expected = status == expected && strstr(kite_last_error(), substring) != NULL;
        if (!as_expected) fprintf(stderr, "  got status %d: %s\n", status, kite_last_error());
        long report[2] = {grown, as_expected};
        ssize_t written = write(fds[1], report, sizeof report);
        _exit(written == (ssize_t)sizeof report ? 0 : 1);
    }
    close(fds[1]);
    long report[2] = {-1, 0};
    if (read(fds[0], report, sizeof report) != (ssize_t)sizeof report) report[0] = -1;
    *refused = report[1] != 0;
    close(fds[0]);
    int wait_status = 0;
    waitpid(pid, &wait_status, 0);
    return report[0];
}

/* Headers that the JSON reader would spend ~32 bytes per value on are refused by a scan first, at the cost of
 * reading them: a shape of ten million integers, a hundred thousand tensors, a metadata object of two
 * million entries, nesting deeper than a header has. Each refusal grows the peak RSS by less than the header. */
static void test_hostile_headers(void) {
    static const struct {
        const char *head, *item, *tail;
        size_t count;
        const char *message;
    } cases[] = {
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[", "0", "],\"data_offsets\":[0,0]}}", 10 * 1000 * 1000,
         "an array of more than 64 items"},
        {"{", "\"t\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}", "}", 100 * 1000,
         "more than 65536 tensors"},
        {"{\"__metadata__\":{", "\"k\":\"v\"", "}}", 2 * 1000 * 1000, "more than 1048576 commas and brackets"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[", "[0]", "],\"data_offsets\":[0,0]}}", 1, "nested deeper"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t size = 0;
        unsigned char *bytes = hostile_image(cases[i].head, cases[i].item, cases[i].count, cases[i].tail, &size);
        CHECK(bytes != NULL);
        if (!bytes) continue;
        bool refused = false;
        long grown_kib = refusal_peak_kib(bytes, size, KITE_ERROR_INVALID_CHECKPOINT, cases[i].message, &refused);
        CHECK_MSG(refused, "case %zu: not refused with \"%s\"", i, cases[i].message);
        CHECK_MSG(grown_kib >= 0 && (size_t)grown_kib * 1024 < size + ((size_t)4 << 20),
                  "case %zu (\"%s\"): header of %zu bytes, peak RSS grew by %ld KiB", i, cases[i].message, size,
                  grown_kib);
        free(bytes);
    }
    /* A shape of 9 to 64 dims passes the scan, so the parser names the tensor it cannot read. */
    size_t size = 0;
    unsigned char *bytes = hostile_image("{\"t\":{\"dtype\":\"F32\",\"shape\":[", "1", 64, "],\"data_offsets\":[0,4]}}",
                                         &size);
    CHECK(bytes != NULL);
    if (bytes) {
        safetensors_file *file = NULL;
        EXPECT(safetensors_parse_memory(bytes, size, "x/model.safetensors", &file), KITE_ERROR_UNSUPPORTED,
               "tensor t: field shape has 64 dimensions");
        free(bytes);
    }
}

static void test_dtype_conversions(void) {
    CHECK(f16_to_float(0x3c00) == 1.0f);
    CHECK(f16_to_float(0xc000) == -2.0f);
    CHECK(f16_to_float(0x7bff) == 65504.0f);
    CHECK(f16_to_float(0x0001) == ldexpf(1.0f, -24)); /* smallest subnormal */
    CHECK(f16_to_float(0x03ff) == ldexpf(1023.0f, -24));
    CHECK(f16_to_float(0x0400) == ldexpf(1.0f, -14));       /* smallest normal */
    CHECK(f16_to_float(0x3555) == 0.25f + 0x155 / 4096.0f); /* exponent 13, mantissa 0x155 */
    CHECK(f16_to_float(0x0000) == 0.0f && !signbit(f16_to_float(0x0000)));
    CHECK(f16_to_float(0x8000) == 0.0f && signbit(f16_to_float(0x8000)));
    CHECK(isinf(f16_to_float(0x7c00)) && f16_to_float(0x7c00) > 0);
    CHECK(isinf(f16_to_float(0xfc00)) && f16_to_float(0xfc00) < 0);
    CHECK(isnan(f16_to_float(0x7e00)));

    /* Unaligned sources are fine: tensors sit wherever their file offset puts them. */
    unsigned char buffer[1 + 3 * 4];
    uint16_t bf16[3] = {float_to_bf16(1.5f), float_to_bf16(-0.25f), float_to_bf16(3.0f)};
    memcpy(buffer + 1, bf16, sizeof bf16);
    float out[3];
    tensor_to_float(TENSOR_DTYPE_BF16, buffer + 1, out, 3);
    CHECK(out[0] == 1.5f && out[1] == -0.25f && out[2] == 3.0f);
    uint16_t f16[3] = {0x3c00, 0xb400, 0x4200};
    memcpy(buffer + 1, f16, sizeof f16);
    tensor_to_float(TENSOR_DTYPE_F16, buffer + 1, out, 3);
    CHECK(out[0] == 1.0f && out[1] == -0.25f && out[2] == 3.0f);
    float f32[3] = {1.0f, -2.0f, 0.125f};
    memcpy(buffer + 1, f32, sizeof f32);
    tensor_to_float(TENSOR_DTYPE_F32, buffer + 1, out, 3);
    CHECK(out[0] == 1.0f && out[1] == -2.0f && out[2] == 0.125f);
}

int main(void) {
    TEST_RUN(test_valid_file);
    TEST_RUN(test_header_length);
    TEST_RUN(test_header_json);
    TEST_RUN(test_fields);
    TEST_RUN(test_unsupported_dtypes);
    TEST_RUN(test_spans);
    TEST_RUN(test_files);
    TEST_RUN(test_corruptions_never_crash);
    TEST_RUN(test_dtype_conversions);
    TEST_RUN(test_hostile_headers);
    return test_finish();
}

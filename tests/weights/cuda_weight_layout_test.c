/* The CUDA backend's weight layout (backend/cuda_weight_layout.h) without a GPU: the offsets and total of the
 * Qwen3-0.6B shape, tied and untied, against sizes worked out by hand; every piece aligned; the allocation cut
 * into 1 GiB segments named weights.N that tile it; a cache entry's segments accepted only when their count, names
 * and sizes are this config's (a tied model's entry never fits an untied config, nor the reverse); configs with a
 * non-positive or overflowing size refused by field; the fp8 layout (codes then block scales per linear piece) of
 * the same shape, its entry never fitting the bf16 layout, and fp8 refused where a fused block would straddle; the
 * fp8 upload emulated on the host (every source's codes and scales, quantized by quant/fp8.c, written where
 * cuda_weight_layout_fp8_sources places them) and the fused pieces read back as the device's readers index them
 * (code x scale[row / 128][col / 128], row stride scale_cols) give each source's fp8 values, the CPU's. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda_weight_layout.h"
#include "model/dummy.h"
#include "quant/fp8.h"
#include "quant/fp8_weights.h"
#include "test_util.h"
#include "util/error.h"

/* The 0.6B shape as model/dummy.h knows it, tied or not. */
static qwen3_config shape_0p6b(bool tied) {
    qwen3_config c;
    memset(&c, 0, sizeof c);
    CHECK_MSG(known_shape_config("qwen3-0.6b-base", &c) == KITE_OK, "%s", kite_last_error());
    c.tie_word_embeddings = tied;
    return c;
}

/* Bytes of the 0.6B pieces: embed 151936 x 1024 bf16; per layer qkv (2048 + 2 x 1024) x 1024, o 1024 x 2048,
 * gate_up 6144 x 1024, down 1024 x 3072 (bf16), two hidden norms of 4 KiB and two head norms of 512 B. */
#define EMBED_BYTES 311164928ull
#define LAYER_BYTES (8388608ull + 4194304ull + 12582912ull + 6291456ull + 2 * 4096ull + 2 * 512ull)
#define GIB 1073741824ull

static void test_0p6b_offsets(void) {
    cuda_weight_layout tied, untied;
    qwen3_config c = shape_0p6b(true);
    CHECK(cuda_weight_layout_make(&c, true, KITE_WEIGHTS_BF16, &tied) == KITE_OK);
    c.tie_word_embeddings = false;
    CHECK(cuda_weight_layout_make(&c, false, KITE_WEIGHTS_BF16, &untied) == KITE_OK);

    CHECK(tied.tied && tied.embed == 0 && tied.lm_head == 0 && tied.final_norm == EMBED_BYTES);
    CHECK(tied.first_layer == EMBED_BYTES + 4096 && tied.layer_bytes == LAYER_BYTES);
    CHECK(tied.layer.qkv == 0 && tied.layer.o == 8388608 && tied.layer.gate_up == 8388608 + 4194304 &&
          tied.layer.down == 8388608 + 4194304 + 12582912 && tied.layer.input_norm == LAYER_BYTES - 9216 &&
          tied.layer.post_norm == LAYER_BYTES - 5120 && tied.layer.q_norm == LAYER_BYTES - 1024 &&
          tied.layer.k_norm == LAYER_BYTES - 512);
    CHECK_MSG(tied.total == EMBED_BYTES + 4096 + 28 * LAYER_BYTES, "tied total %llu", (unsigned long long)tied.total);
    CHECK(tied.total == 1192230912ull);

    CHECK(!untied.tied && untied.lm_head == EMBED_BYTES && untied.final_norm == 2 * EMBED_BYTES);
    CHECK(untied.first_layer == 2 * EMBED_BYTES + 4096 && untied.total == tied.total + EMBED_BYTES);
    CHECK(memcmp(&tied.layer, &untied.layer, sizeof tied.layer) == 0);
}

/* A shape whose pieces are not multiples of 256 bytes (norms of 32 floats, a 151936 x 40 embedding). */
static void test_every_piece_aligned(void) {
    qwen3_config c = shape_0p6b(false);
    c.hidden_size = 40;
    c.intermediate_size = 72;
    c.head_dim = 32;
    c.n_heads = 3;
    c.n_kv_heads = 1;
    c.n_layers = 3;
    cuda_weight_layout l;
    CHECK(cuda_weight_layout_make(&c, false, KITE_WEIGHTS_BF16, &l) == KITE_OK);
    const uint64_t offsets[] = {l.embed,           l.lm_head,      l.final_norm,    l.first_layer, l.layer_bytes,
                                l.layer.qkv,       l.layer.o,      l.layer.gate_up, l.layer.down,  l.layer.input_norm,
                                l.layer.post_norm, l.layer.q_norm, l.layer.k_norm,  l.total};
    for (size_t i = 0; i < sizeof offsets / sizeof offsets[0]; i++)
        CHECK_MSG(offsets[i] % CUDA_WEIGHT_ALIGN == 0, "offset %zu: %llu", i, (unsigned long long)offsets[i]);
    /* Each piece holds its tensor: the next piece starts at or past its end. */
    CHECK(l.lm_head >= l.embed + 151936ull * 40 * 2 && l.final_norm >= l.lm_head + 151936ull * 40 * 2);
    CHECK(l.layer.o >= (3 + 2) * 32ull * 40 * 2 && l.layer.k_norm + 32 * 4 <= l.layer_bytes);
    CHECK(l.total == l.first_layer + 3 * l.layer_bytes);
}

static void test_segments_tile_the_allocation(void) {
    qwen3_config c = shape_0p6b(false);
    cuda_weight_layout l;
    CHECK(cuda_weight_layout_make(&c, false, KITE_WEIGHTS_BF16, &l) == KITE_OK);
    CHECK(cuda_weight_layout_segment_count(&l) == 2);
    backend_segment s;
    uint64_t offset;
    cuda_weight_layout_segment(&l, 0, &s, &offset);
    CHECK(strcmp(s.name, "weights.0") == 0 && s.size == GIB && offset == 0);
    cuda_weight_layout_segment(&l, 1, &s, &offset);
    CHECK(strcmp(s.name, "weights.1") == 0 && s.size == l.total - GIB && offset == GIB);

    /* Exactly 1 GiB is one segment; one byte more is two. */
    cuda_weight_layout exact = l;
    exact.total = GIB;
    CHECK(cuda_weight_layout_segment_count(&exact) == 1);
    cuda_weight_layout_segment(&exact, 0, &s, &offset);
    CHECK(s.size == GIB);
    exact.total = GIB + 256;
    CHECK(cuda_weight_layout_segment_count(&exact) == 2);
    cuda_weight_layout_segment(&exact, 1, &s, &offset);
    CHECK(s.size == 256 && offset == GIB);

    /* A small model is one segment of its whole allocation. */
    c.n_layers = 1;
    c.vocab_size = 1000;
    CHECK(cuda_weight_layout_make(&c, true, KITE_WEIGHTS_BF16, &l) == KITE_OK);
    CHECK(cuda_weight_layout_segment_count(&l) == 1);
    cuda_weight_layout_segment(&l, 0, &s, &offset);
    CHECK(s.size == l.total && offset == 0);
}

/* ---- an entry's segments against a config --------------------------------------------------------- */

#define MAX_FAKE 8
typedef struct fake_entry {
    backend_segment segments[MAX_FAKE];
    backend_segment_source source;
} fake_entry;

static kite_status fake_read(const backend_segment_source *self, int32_t index, uint64_t offset, void *dst,
                             size_t size) {
    (void)self, (void)index, (void)offset, (void)dst, (void)size;
    return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "the check reads nothing");
}

/* What list_segments exports for layout l. */
static void fake_from(const cuda_weight_layout *l, fake_entry *e) {
    memset(e, 0, sizeof *e);
    const int32_t n = cuda_weight_layout_segment_count(l);
    CHECK(n <= MAX_FAKE);
    for (int32_t i = 0; i < n && i < MAX_FAKE; i++) {
        uint64_t offset;
        cuda_weight_layout_segment(l, i, &e->segments[i], &offset);
    }
    e->source = (backend_segment_source){
        .n_segments = n, .segments = e->segments, .chunk_bytes = 16 << 20, .read = fake_read, .context = NULL};
}

static void expect_refused(const cuda_weight_layout *l, const fake_entry *e, const char *substring, int line) {
    kite_status s = cuda_weight_layout_check_source(l, &e->source);
    CHECK_MSG(s == KITE_ERROR_INVALID_CHECKPOINT && strstr(kite_last_error(), substring),
              "line %d: status %d, '%s' (wanted '%s')", line, (int)s, s == KITE_OK ? "" : kite_last_error(), substring);
}
#define EXPECT_REFUSED(l, e, substring) expect_refused(l, e, substring, __LINE__)

static void test_check_source(void) {
    qwen3_config c = shape_0p6b(true);
    cuda_weight_layout tied, untied;
    CHECK(cuda_weight_layout_make(&c, true, KITE_WEIGHTS_BF16, &tied) == KITE_OK);
    c.tie_word_embeddings = false;
    CHECK(cuda_weight_layout_make(&c, false, KITE_WEIGHTS_BF16, &untied) == KITE_OK);

    fake_entry e;
    fake_from(&tied, &e);
    CHECK(cuda_weight_layout_check_source(&tied, &e.source) == KITE_OK);
    /* The order in the entry is free: segments are found by name. */
    backend_segment swap = e.segments[0];
    e.segments[0] = e.segments[1];
    e.segments[1] = swap;
    CHECK(cuda_weight_layout_check_source(&tied, &e.source) == KITE_OK);

    /* The tied model's entry against the untied config, and the reverse: the same count, other sizes. */
    fake_from(&tied, &e);
    EXPECT_REFUSED(&untied, &e, "segment weights.1 holds");
    fake_from(&untied, &e);
    EXPECT_REFUSED(&tied, &e, "segment weights.1 holds");

    fake_from(&tied, &e);
    e.segments[1].size -= 256;
    EXPECT_REFUSED(&tied, &e, "weights.1");
    fake_from(&tied, &e);
    e.source.n_segments = 1;
    EXPECT_REFUSED(&tied, &e, "the entry holds 1 segments");
    fake_from(&tied, &e);
    snprintf(e.segments[0].name, sizeof e.segments[0].name, "model.embed_tokens.weight");
    EXPECT_REFUSED(&tied, &e, "segment weights.0 is missing");
    fake_from(&tied, &e);
    e.source.chunk_bytes = 0;
    EXPECT_REFUSED(&tied, &e, "chunks of 0 bytes");
    e.source.chunk_bytes = 2 * GIB;
    EXPECT_REFUSED(&tied, &e, "chunks of");

    /* Another shape's entry (one layer fewer) does not fit either. */
    c.n_layers = 27;
    c.tie_word_embeddings = true;
    cuda_weight_layout shallower;
    CHECK(cuda_weight_layout_make(&c, true, KITE_WEIGHTS_BF16, &shallower) == KITE_OK);
    fake_from(&shallower, &e);
    EXPECT_REFUSED(&tied, &e, "weights.1");
}

/* The 0.6B shape with fp8 linear pieces: qkv codes 4096 x 1024 B then 32 x 8 scales, o 1024 x 2048 B then 8 x 16,
 * gate_up 6144 x 1024 B then 48 x 8, down 1024 x 3072 B then 8 x 24 (float32 scales, each run aligned). */
#define FP8_LAYER_BYTES                                                                                  \
    (4194304ull + 1024ull + 2097152ull + 512ull + 6291456ull + 1536ull + 3145728ull + 768ull + 2 * 4096ull + 2 * 512ull)

static void test_0p6b_fp8(void) {
    qwen3_config c = shape_0p6b(true);
    cuda_weight_layout l, bf16;
    CHECK_MSG(cuda_weight_layout_make(&c, true, KITE_WEIGHTS_FP8, &l) == KITE_OK, "%s", kite_last_error());
    CHECK(cuda_weight_layout_make(&c, true, KITE_WEIGHTS_BF16, &bf16) == KITE_OK);
    CHECK(l.weights == KITE_WEIGHTS_FP8 && bf16.weights == KITE_WEIGHTS_BF16);
    CHECK(l.embed == 0 && l.lm_head == 0 && l.final_norm == EMBED_BYTES && l.first_layer == EMBED_BYTES + 4096);
    CHECK_MSG(l.layer_bytes == FP8_LAYER_BYTES, "fp8 layer bytes %llu", (unsigned long long)l.layer_bytes);
    CHECK(l.layer.qkv == 0 && l.layer.qkv_scale == 4194304);
    CHECK(l.layer.o == 4194304 + 1024 && l.layer.o_scale == l.layer.o + 2097152);
    CHECK(l.layer.gate_up == l.layer.o_scale + 512 && l.layer.gate_up_scale == l.layer.gate_up + 6291456);
    CHECK(l.layer.down == l.layer.gate_up_scale + 1536 && l.layer.down_scale == l.layer.down + 3145728);
    CHECK(l.layer.input_norm == l.layer.down_scale + 768 && l.layer.k_norm == FP8_LAYER_BYTES - 512);
    CHECK(bf16.layer.qkv_scale == 0 && bf16.layer.down_scale == 0);
    CHECK(l.total == EMBED_BYTES + 4096 + 28 * FP8_LAYER_BYTES);
    CHECK(cuda_weight_layout_scale_cols(1024) == 8 && cuda_weight_layout_scale_cols(1025) == 9);
    const uint64_t pieces[] = {l.layer.qkv_scale, l.layer.o, l.layer.o_scale, l.layer.gate_up,
                               l.layer.gate_up_scale, l.layer.down, l.layer.down_scale};
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++)
        CHECK_MSG(pieces[i] % CUDA_WEIGHT_ALIGN == 0, "piece %zu at %llu", i, (unsigned long long)pieces[i]);

    /* An fp8 entry never reads as the bf16 weights of the same model, nor the reverse. */
    fake_entry e;
    fake_from(&l, &e);
    CHECK(cuda_weight_layout_check_source(&l, &e.source) == KITE_OK);
    EXPECT_REFUSED(&bf16, &e, "this model's CUDA weights");
    fake_from(&bf16, &e);
    kite_status s = cuda_weight_layout_check_source(&l, &e.source);
    CHECK_MSG(s == KITE_ERROR_INVALID_CHECKPOINT && strstr(kite_last_error(), "fp8"), "bf16 entry vs fp8: %d %s",
              (int)s, s == KITE_OK ? "" : kite_last_error());

    /* An intermediate size of 3,000 would put up_proj's first row inside gate_proj's last 128-row block. */
    c.intermediate_size = 3000;
    CHECK(cuda_weight_layout_make(&c, true, KITE_WEIGHTS_FP8, &l) == KITE_ERROR_UNSUPPORTED &&
          strstr(kite_last_error(), "intermediate_size (3000)"));
    CHECK(cuda_weight_layout_make(&c, true, KITE_WEIGHTS_BF16, &l) == KITE_OK);
    c = shape_0p6b(true);
    CHECK(cuda_weight_layout_make(&c, true, (kite_weights)7, &l) == KITE_ERROR_INVALID_ARGUMENT &&
          strstr(kite_last_error(), "weights mode 7"));
}

static void test_bad_configs_refused(void) {
    cuda_weight_layout l;
    qwen3_config c = shape_0p6b(true);
    c.hidden_size = 0;
    CHECK(cuda_weight_layout_make(&c, true, KITE_WEIGHTS_BF16, &l) == KITE_ERROR_INVALID_ARGUMENT &&
          strstr(kite_last_error(), "hidden_size is 0"));
    c = shape_0p6b(true);
    c.n_kv_heads = -2;
    CHECK(cuda_weight_layout_make(&c, true, KITE_WEIGHTS_BF16, &l) == KITE_ERROR_INVALID_ARGUMENT &&
          strstr(kite_last_error(), "num_key_value_heads is -2"));
    c = shape_0p6b(false);
    c.vocab_size = INT32_MAX;
    c.hidden_size = INT32_MAX;
    c.intermediate_size = INT32_MAX;
    c.n_layers = INT32_MAX;
    CHECK(cuda_weight_layout_make(&c, false, KITE_WEIGHTS_BF16, &l) == KITE_ERROR_INVALID_ARGUMENT &&
          strstr(kite_last_error(), "do not fit"));
}

/* A layer's fused fp8 piece as the dequantizer and the fp8 GEMV read it: rows x cols codes at `codes`, scales at
 * `scales` with a row stride of cuda_weight_layout_scale_cols(cols). */
static float fused_value(const unsigned char *layer, uint64_t codes, uint64_t scales, int64_t cols, int64_t row,
                         int64_t col) {
    const uint64_t block =
        (uint64_t)(row / 128) * (uint64_t)cuda_weight_layout_scale_cols(cols) + (uint64_t)(col / 128);
    float scale;
    memcpy(&scale, layer + scales + 4 * block, sizeof scale);
    return fp8_e4m3_to_float(layer[codes + (uint64_t)row * (uint64_t)cols + (uint64_t)col]) * scale;
}

static void test_fp8_upload_emulated(void) {
    /* Small, with hidden 320 (partial column blocks, and o_proj / down_proj with a partial row block), two kv heads'
     * worth of fused rows ahead of v_proj and up_proj starting at row 384. */
    qwen3_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 64;
    c.hidden_size = 320;
    c.intermediate_size = 384;
    c.n_layers = 2;
    c.n_heads = 2;
    c.n_kv_heads = 1;
    c.head_dim = 128;
    cuda_weight_layout l;
    CHECK_MSG(cuda_weight_layout_make(&c, false, KITE_WEIGHTS_FP8, &l) == KITE_OK, "%s", kite_last_error());
    cuda_fp8_source_place places[CUDA_FP8_SOURCES];
    CHECK_MSG(cuda_weight_layout_fp8_sources(&l, &c, places) == KITE_OK, "%s", kite_last_error());
    cuda_weight_layout bf16;
    CHECK(cuda_weight_layout_make(&c, false, KITE_WEIGHTS_BF16, &bf16) == KITE_OK);
    CHECK(cuda_weight_layout_fp8_sources(&bf16, &c, places) == KITE_ERROR_INVALID_ARGUMENT);
    CHECK(cuda_weight_layout_fp8_sources(&l, &c, places) == KITE_OK);
    const int64_t shapes[CUDA_FP8_SOURCES][2] = {{256, 320}, {128, 320}, {128, 320}, {320, 256},
                                                 {384, 320}, {384, 320}, {320, 384}};
    const char *names[CUDA_FP8_SOURCES] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    for (int i = 0; i < CUDA_FP8_SOURCES; i++)
        CHECK_MSG(strcmp(places[i].name, names[i]) == 0 && places[i].rows == shapes[i][0] &&
                      places[i].cols == shapes[i][1] &&
                      places[i].scale_ld == cuda_weight_layout_scale_cols(shapes[i][1]),
                  "source %d: %s %lld x %lld", i, places[i].name, (long long)places[i].rows, (long long)places[i].cols);

    unsigned char *bytes = calloc(1, (size_t)l.total);
    CHECK(bytes != NULL);
    if (!bytes) return;
    /* Every source as the upload writes it: its quantized codes and its scale grid, contiguous, at its place; the
     * bytes each write covers marked, so that two sources never share a byte and each stays in its fused piece. */
    unsigned char *written = calloc(1, (size_t)l.layer_bytes);
    CHECK(written != NULL);
    if (!written) {
        free(bytes);
        return;
    }
    float *values[CUDA_FP8_SOURCES] = {0}, *expected[CUDA_FP8_SOURCES] = {0};
    uint32_t seed = 12345;
    for (int layer = 0; layer < c.n_layers; layer++) {
        unsigned char *at = bytes + l.first_layer + (uint64_t)layer * l.layer_bytes;
        memset(written, 0, (size_t)l.layer_bytes);
        for (int i = 0; i < CUDA_FP8_SOURCES; i++) {
            const int64_t rows = places[i].rows, cols = places[i].cols;
            const size_t n = (size_t)rows * (size_t)cols;
            const size_t n_scales = (size_t)fp8_block_count(rows, FP8_BLOCK_SIZE) * (size_t)places[i].scale_ld;
            values[i] = malloc(n * sizeof(float));
            expected[i] = malloc(n * sizeof(float));
            uint8_t *codes = malloc(n);
            float *scales = malloc(n_scales * sizeof(float));
            CHECK(values[i] && expected[i] && codes && scales);
            /* Each block of its own magnitude, so a scale read from the wrong block shows. */
            for (int64_t r = 0; r < rows; r++)
                for (int64_t col = 0; col < cols; col++) {
                    seed = seed * 1664525u + 1013904223u;
                    const float unit = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
                    values[i][r * cols + col] = unit * (float)(1 + i + 7 * layer + (r / 128) * 3 + (col / 128) * 5);
                }
            CHECK(fp8_quantize_blocks(values[i], rows, cols, codes, scales, names[i]) == KITE_OK);
            const tensor_view view = {.dtype = TENSOR_DTYPE_F32, .n_dims = 2, .shape = {rows, cols}, .data = values[i]};
            CHECK(fp8_weights_linear_to_float(&view, KITE_WEIGHTS_FP8, names[i], expected[i]) == KITE_OK);
            const uint64_t ranges[2][2] = {{places[i].codes, n}, {places[i].scales, n_scales * sizeof(float)}};
            for (int k = 0; k < 2; k++) {
                CHECK(ranges[k][0] + ranges[k][1] <= l.layer_bytes);
                size_t overlaps = 0;
                for (uint64_t b = ranges[k][0]; b < ranges[k][0] + ranges[k][1] && b < l.layer_bytes; b++)
                    overlaps += written[b]++ != 0;
                CHECK_MSG(overlaps == 0, "layer %d %s: %zu bytes written twice", layer, names[i], overlaps);
            }
            memcpy(at + places[i].codes, codes, n);
            memcpy(at + places[i].scales, scales, n_scales * sizeof(float));
            free(codes);
            free(scales);
        }
        /* The fused pieces read back: each source's rows at its first row in the piece. */
        const struct {
            uint64_t codes, scales;
            int64_t cols;
            int first_source, n_sources;
        } pieces[4] = {{l.layer.qkv, l.layer.qkv_scale, 320, 0, 3},
                       {l.layer.o, l.layer.o_scale, 256, 3, 1},
                       {l.layer.gate_up, l.layer.gate_up_scale, 320, 4, 2},
                       {l.layer.down, l.layer.down_scale, 384, 6, 1}};
        for (int p = 0; p < 4; p++) {
            int64_t row0 = 0;
            for (int s = pieces[p].first_source; s < pieces[p].first_source + pieces[p].n_sources; s++) {
                size_t differ = 0;
                for (int64_t r = 0; r < places[s].rows; r++)
                    for (int64_t col = 0; col < places[s].cols; col++) {
                        const float got =
                            fused_value(at, pieces[p].codes, pieces[p].scales, pieces[p].cols, row0 + r, col);
                        differ += memcmp(&got, &expected[s][r * places[s].cols + col], sizeof got) != 0;
                    }
                CHECK_MSG(differ == 0, "layer %d %s: %zu values read from the fused piece differ from the CPU's fp8",
                          layer, names[s], differ);
                row0 += places[s].rows;
            }
        }
        for (int i = 0; i < CUDA_FP8_SOURCES; i++) {
            free(values[i]);
            free(expected[i]);
        }
    }
    free(written);
    free(bytes);
}

int main(void) {
    TEST_RUN(test_0p6b_offsets);
    TEST_RUN(test_every_piece_aligned);
    TEST_RUN(test_segments_tile_the_allocation);
    TEST_RUN(test_check_source);
    TEST_RUN(test_0p6b_fp8);
    TEST_RUN(test_fp8_upload_emulated);
    TEST_RUN(test_bad_configs_refused);
    return test_finish();
}

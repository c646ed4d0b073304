/* RoPE frequencies, attention factor and cos / sin tables against transformers 5's, for the default rotation and
 * YaRN: tests/data/yarn/rope_params.json holds, per config, what transformers' Qwen3RotaryEmbedding computed
 * (tests/data/tools/make_yarn_references.py on the GPU machine, trimmed by trim_yarn_rope_params.py). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/python_json.h"
#include "checkpoint/config.h"
#include "model/rope.h"
#include "test_util.h"
#include "util/error.h"
#include "util/file.h"
#include "util/json.h"

#define MAX_HALF 256

/* Distance of two floats in units in the last place (both finite, same sign or zero). */
static long ulps_apart(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, sizeof ia);
    memcpy(&ib, &b, sizeof ib);
    if ((ia < 0) != (ib < 0)) return a == b ? 0 : 1L << 30;
    return labs((long)ia - (long)ib);
}

static json_document *load_json(const char *path) {
    char *text = NULL;
    size_t length = 0;
    if (file_read_all(path, (size_t)16 << 20, KITE_ERROR_IO, &text, &length) != KITE_OK) {
        fprintf(stderr, "cannot read %s: %s\n", path, kite_last_error());
        return NULL;
    }
    json_error error;
    json_document *document = json_parse(text, length, &error);
    free(text);
    if (!document) fprintf(stderr, "%s: %s\n", path, error.message);
    return document;
}

/* The case's config dict as config.json text, parsed by kite. */
static kite_status parse_case_config(const json_value *config_object, qwen3_config *config) {
    text_builder b = {0};
    python_json_value(&b, config_object, -1, false);
    kite_status status = b.failed ? KITE_ERROR_OUT_OF_MEMORY : qwen3_config_parse(b.data, b.length, "case", config);
    text_builder_free(&b);
    return status;
}

/* transformers computes these and kite refuses them: a factor below 1 shrinks the context, beta_fast below
 * beta_slow inverts the correction range (transformers only warns about both). */
static const struct {
    const char *name, *needle;
} refused_cases[] = {
    {"factor05", "rope_scaling.factor is 0.5, must be at least 1"},
    {"beta_fast_below_slow", "rope_scaling.beta_fast (1) must not be below beta_slow (32)"},
};

static void check_case(const char *name, const json_value *c) {
    const json_value *error = json_object_member(c, "error");
    CHECK_MSG(!error, "%s: transformers refused it: %s", name, error ? error->as.string : "");
    if (error) return;
    qwen3_config config;
    kite_status status = parse_case_config(json_object_member(c, "config"), &config);
    for (size_t i = 0; i < sizeof refused_cases / sizeof refused_cases[0]; i++) {
        if (strcmp(name, refused_cases[i].name) != 0) continue;
        CHECK_MSG(status == KITE_ERROR_INVALID_CHECKPOINT && strstr(kite_last_error(), refused_cases[i].needle),
                  "%s: status %d: %s", name, status, kite_last_error());
        return;
    }
    CHECK_MSG(status == KITE_OK, "%s: %s", name, kite_last_error());
    if (status != KITE_OK) return;
    CHECK_MSG(config.rope_yarn, "%s: not read as YaRN", name);

    /* the standardized original_max_position_embeddings and factor: the context limit is their product */
    const json_value *standardized = json_object_member(c, "standardized");
    int64_t original = 0;
    double factor = 0.0;
    CHECK(json_get_int64(json_object_member(standardized, "original_max_position_embeddings"), &original));
    CHECK(json_get_double(json_object_member(standardized, "factor"), &factor));
    CHECK_MSG(config.yarn.original_max_positions == original, "%s: original_max_position_embeddings %d, wanted %lld",
              name, config.yarn.original_max_positions, (long long)original);
    CHECK_MSG(config.yarn.factor == factor && config.context_limit == (int32_t)floor(factor * (double)original),
              "%s: factor %g, limit %d", name, config.yarn.factor, config.context_limit);

    double attention = 0.0;
    CHECK(json_get_double(json_object_member(c, "attention_scaling"), &attention));
    CHECK_MSG(config.yarn.attention_factor == attention, "%s: attention factor %.17g, transformers %.17g", name,
              config.yarn.attention_factor, attention);

    const json_value *want = json_object_member(c, "inv_freq");
    const int32_t half = config.head_dim / 2;
    CHECK_MSG(json_is_array(want) && want->length == (size_t)half && half <= MAX_HALF, "%s: inv_freq has %zu entries",
              name, want ? want->length : 0);
    if (!json_is_array(want) || want->length != (size_t)half || half > MAX_HALF) return;
    float inv_freq[MAX_HALF];
    rope_inv_freq(&config, inv_freq);
    /* Every op but the power is rounded exactly as torch rounds it. torch's float32 pow (SLEEF, within one ulp)
     * rounds one of the 64 powers of theta 1e6 (i = 37) the other way from the correctly rounded power kite
     * computes; the blend carries that into at most two ulps of that one frequency. Everything else is equal. */
    long worst = 0;
    int inexact = 0;
    for (int32_t i = 0; i < half; i++) {
        double expected = 0.0;
        CHECK(json_get_double(&want->as.items[i], &expected));
        long apart = ulps_apart(inv_freq[i], (float)expected);
        if (apart > worst) worst = apart;
        inexact += apart != 0;
        CHECK_MSG(apart <= 2, "%s: inv_freq[%d] %.9g, transformers %.9g (%ld ulps)", name, i, inv_freq[i], expected,
                  apart);
    }
    CHECK_MSG(inexact <= 1, "%s: %d frequencies differ from transformers'", name, inexact);
    printf("  %s: inv_freq: %d of %d differ, by %ld ulp at most; attention factor %.17g, limit %d\n", name, inexact,
           half, worst, attention, config.context_limit);

    /* cos / sin, the attention factor applied, at each position transformers was asked for */
    const json_value *positions = json_object_member(c, "positions");
    const json_value *cos_rows = json_object_member(c, "cos"), *sin_rows = json_object_member(c, "sin");
    if (!positions) return;
    CHECK(json_is_array(cos_rows) && json_is_array(sin_rows) && cos_rows->length == positions->length &&
          sin_rows->length == positions->length);
    double worst_cos = 0.0;
    for (size_t p = 0; p < positions->length; p++) {
        int64_t position = 0;
        CHECK(json_get_int64(&positions->as.items[p], &position));
        float cos_out[MAX_HALF], sin_out[MAX_HALF];
        rope_position_angles(inv_freq, half, rope_attention_factor(&config), (int32_t)position, cos_out, sin_out);
        for (int32_t i = 0; i < half; i++) {
            double want_cos = 0.0, want_sin = 0.0;
            CHECK(json_get_double(&cos_rows->as.items[p].as.items[i], &want_cos));
            CHECK(json_get_double(&sin_rows->as.items[p].as.items[i], &want_sin));
            /* The angle is transformers' float32 product exactly where inv_freq is; what is left is torch's float32
             * cos / sin against libm's (a few ulps) and, where inv_freq is one ulp apart, that ulp times the
             * position. */
            double tolerance = 4e-7 * attention + (double)position * 1.2e-7 * (double)inv_freq[i];
            double d = fmax(fabs(cos_out[i] - want_cos), fabs(sin_out[i] - want_sin));
            if (d > worst_cos) worst_cos = d;
            CHECK_MSG(d <= tolerance, "%s: position %lld dim %d: cos %.9g sin %.9g, transformers %.9g %.9g", name,
                      (long long)position, i, cos_out[i], sin_out[i], want_cos, want_sin);
        }
    }
    printf("  %s: cos / sin within %.3g\n", name, worst_cos);
}

static void test_transformers_cases(void) {
    json_document *document = load_json(KITE_TEST_DATA_DIR "/yarn/rope_params.json");
    CHECK(document != NULL);
    if (!document) return;
    const json_value *cases = json_object_member(json_root(document), "cases");
    CHECK(json_is_object(cases) && cases->length >= 10);
    for (size_t i = 0; cases && i < cases->length; i++) check_case(cases->as.members[i].key, &cases->as.members[i].value);
    json_free(document);
}

/* The default rotation: 1 / theta^(2i/d) rounded as transformers' float32 ops, no attention factor. */
static void test_default_rotation(void) {
    qwen3_config config;
    memset(&config, 0, sizeof config);
    config.head_dim = 128;
    config.rope_theta = 1000000.0;
    float inv_freq[64];
    rope_inv_freq(&config, inv_freq);
    CHECK(inv_freq[0] == 1.0f);
    for (int i = 0; i < 64; i++) {
        double exact = pow(1000000.0, -(double)(2 * i) / 128.0);
        CHECK_MSG(fabs(inv_freq[i] - exact) <= 2e-7 * exact, "inv_freq[%d] %.9g vs %.9g", i, inv_freq[i], exact);
    }
    CHECK(rope_attention_factor(&config) == 1.0f);
    float c[64], s[64];
    rope_position_angles(inv_freq, 64, 1.0f, 0, c, s);
    for (int i = 0; i < 64; i++) CHECK(c[i] == 1.0f && s[i] == 0.0f);
    rope_position_angles(inv_freq, 64, 1.0f, 5, c, s);
    CHECK(fabs(c[0] - cos(5.0)) < 1e-7 && fabs(s[0] - sin(5.0)) < 1e-7);
}

int main(void) {
    TEST_RUN(test_transformers_cases);
    TEST_RUN(test_default_rotation);
    return test_finish();
}

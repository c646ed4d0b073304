/* The runtime switches' registry (util/options.h): defaults, range checks with messages that name the switch,
 * the public listing, and docs/OPTIONS.md against what `kite info --options --markdown` prints from it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kite.h"
#include "test_util.h"
#include "util/options.h"

static void test_defaults_when_unset(void) {
    unsetenv("KITE_CUDA_GRAPH");
    setenv("KITE_ENGINE_OVERLAP", "", 1); /* empty counts as unset */
    runtime_options o;
    CHECK(options_read(&o) == KITE_OK);
    const runtime_options d = options_default();
    CHECK(memcmp(&o, &d, sizeof o) == 0);
    CHECK(o.cuda_graph == 1 && o.engine_overlap == 1);
    unsetenv("KITE_ENGINE_OVERLAP");
}

static void test_values_are_read(void) {
    setenv("KITE_CUDA_GRAPH", "0", 1);
    runtime_options o;
    CHECK(options_read(&o) == KITE_OK);
    CHECK(o.cuda_graph == 0);
    CHECK(o.cuda_pdl == 1);
    unsetenv("KITE_CUDA_GRAPH");
}

static void test_bad_values_name_the_switch(void) {
    const char *bad[] = {"2", "-1", "yes", "1x", " 1", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("KITE_CUDA_LM_HEAD_SCREEN", bad[i], 1);
        runtime_options o = options_default();
        CHECK_MSG(options_read(&o) == KITE_ERROR_INVALID_ARGUMENT, "value '%s' accepted", bad[i]);
        CHECK_MSG(strstr(kite_last_error(), "KITE_CUDA_LM_HEAD_SCREEN") != NULL, "message: %s", kite_last_error());
        CHECK(strstr(kite_last_error(), "0 or 1") != NULL);
    }
    unsetenv("KITE_CUDA_LM_HEAD_SCREEN");
}

static void test_listing(void) {
    const int32_t n = kite_option_count();
    CHECK(n > 0);
    setenv("KITE_CUDA_PDL", "7", 1);
    int found = 0;
    for (int32_t i = 0; i < n; i++) {
        kite_option_info info;
        CHECK(kite_option_get(i, &info) == KITE_OK);
        CHECK(info.name && strncmp(info.name, "KITE_", 5) == 0 && info.doc && *info.doc);
        CHECK(info.default_value >= info.min && info.default_value <= info.max);
        if (strcmp(info.name, "KITE_CUDA_PDL") == 0) {
            found = 1;
            CHECK(!info.valid && info.environment && strcmp(info.environment, "7") == 0);
            CHECK(info.value == info.default_value);
        }
    }
    CHECK(found);
    kite_option_info info;
    CHECK(kite_option_get(n, &info) == KITE_ERROR_INVALID_ARGUMENT);
    CHECK(kite_option_get(-1, &info) == KITE_ERROR_INVALID_ARGUMENT);
    unsetenv("KITE_CUDA_PDL");
}

/* docs/OPTIONS.md's table is exactly what the CLI prints from the registry (scripts/gen-options-doc.sh). */
static void test_doc_matches_registry(void) {
    char *doc = test_read_file(KITE_SOURCE_DIR "/docs/OPTIONS.md", NULL);
    CHECK_MSG(doc != NULL, "docs/OPTIONS.md is missing");
    FILE *p = popen(KITE_CLI_PATH " info --options --markdown", "r");
    CHECK(p != NULL);
    if (!doc || !p) {
        free(doc);
        if (p) pclose(p);
        return;
    }
    char table[16384];
    size_t n = fread(table, 1, sizeof table - 1, p);
    table[n] = '\0';
    CHECK(pclose(p) == 0);
    CHECK(n > 0 && n < sizeof table - 1);
    const char *at = strstr(doc, "| switch |");
    CHECK_MSG(at != NULL && strcmp(at, table) == 0,
              "docs/OPTIONS.md is out of date: run scripts/gen-options-doc.sh");
    free(doc);
}

int main(void) {
    TEST_RUN(test_defaults_when_unset);
    TEST_RUN(test_values_are_read);
    TEST_RUN(test_bad_values_name_the_switch);
    TEST_RUN(test_listing);
    TEST_RUN(test_doc_matches_registry);
    return test_finish();
}

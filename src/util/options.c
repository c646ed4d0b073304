/* The runtime switches' registry (options.h) and its public listing (kite.h: kite_option_count,
 * kite_option_get). */
#include "util/options.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/error.h"

typedef enum option_type { OPTION_BOOL, OPTION_INT } option_type;

typedef struct option_spec {
    const char *name;
    option_type type;
    int32_t default_value, min, max;
    const char *doc;
    size_t offset; /* of the field in runtime_options */
} option_spec;

static const option_spec option_specs[] = {
#define KITE_OPTION_SPEC(field, name, type, def, lo, hi, doc) \
    {name, OPTION_##type, def, lo, hi, doc, offsetof(runtime_options, field)},
    KITE_OPTIONS(KITE_OPTION_SPEC)
#undef KITE_OPTION_SPEC
};

enum { N_OPTIONS = sizeof option_specs / sizeof option_specs[0] };

static int32_t *option_field(runtime_options *options, const option_spec *spec) {
    return (int32_t *)((char *)options + spec->offset);
}

runtime_options options_default(void) {
    runtime_options options;
    for (int i = 0; i < N_OPTIONS; i++) *option_field(&options, &option_specs[i]) = option_specs[i].default_value;
    return options;
}

/* The value of one switch: its default when unset or empty, else the whole string as a decimal integer in
 * [min, max]. */
static kite_status parse_option(const option_spec *spec, int32_t *out) {
    const char *text = getenv(spec->name);
    if (!text || !*text) {
        *out = spec->default_value;
        return KITE_OK;
    }
    char *end = NULL;
    errno = 0;
    const long long value = strtoll(text, &end, 10);
    const bool starts_as_number = (*text >= '0' && *text <= '9') || *text == '-'; /* strtoll skips spaces */
    if (!starts_as_number || errno != 0 || end == text || *end != '\0' || value < spec->min || value > spec->max) {
        if (spec->type == OPTION_BOOL)
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "%s=%s: must be 0 or 1", spec->name, text);
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "%s=%s: must be an integer in [%d, %d]", spec->name, text,
                         (int)spec->min, (int)spec->max);
    }
    *out = (int32_t)value;
    return KITE_OK;
}

kite_status options_read(runtime_options *out) {
    runtime_options options;
    for (int i = 0; i < N_OPTIONS; i++) KITE_TRY(parse_option(&option_specs[i], option_field(&options, &option_specs[i])));
    *out = options;
    return KITE_OK;
}

int32_t kite_option_count(void) { return N_OPTIONS; }

kite_status kite_option_get(int32_t index, kite_option_info *out) {
    if (!out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_option_get: no output given");
    if (index < 0 || index >= N_OPTIONS)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_option_get: index %d is not in [0, %d)", (int)index,
                         (int)N_OPTIONS);
    const option_spec *spec = &option_specs[index];
    const char *text = getenv(spec->name);
    int32_t value = spec->default_value;
    const kite_status status = parse_option(spec, &value);
    *out = (kite_option_info){
        .name = spec->name,
        .is_bool = spec->type == OPTION_BOOL,
        .default_value = spec->default_value,
        .min = spec->min,
        .max = spec->max,
        .doc = spec->doc,
        .environment = text && *text ? text : NULL,
        .value = value,
        .valid = status == KITE_OK,
    };
    if (status != KITE_OK) kite_error_clear(); /* a bad value is reported through .valid, not as a failure */
    return KITE_OK;
}

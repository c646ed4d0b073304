#include "cli_util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

bool cli_parse_int(const char *option, const char *text, long long min, long long max, long long *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > max) {
        fprintf(stderr, "kite: %s: '%s' is not an integer in [%lld, %lld]\n", option, text, min, max);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_float(const char *option, const char *text, double min, double max, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !(v >= min && v <= max)) {
        fprintf(stderr, "kite: %s: '%s' is not a number in [%g, %g]\n", option, text, min, max);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_int_list(const char *option, const char *text, long long min, long long max, int32_t **out, size_t *n) {
    *out = NULL;
    *n = 0;
    size_t count = 1;
    for (const char *p = text; *p; p++) count += *p == ',';
    int32_t *values = malloc(count * sizeof(int32_t));
    char *copy = strdup(text);
    if (!values || !copy) {
        free(values);
        free(copy);
        fprintf(stderr, "kite: out of memory\n");
        return false;
    }
    size_t k = 0;
    char *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        long long v;
        if (!cli_parse_int(option, item, min, max, &v)) {
            free(values);
            free(copy);
            return false;
        }
        values[k++] = (int32_t)v;
    }
    free(copy);
    if (k == 0) {
        fprintf(stderr, "kite: %s: empty list\n", option);
        free(values);
        return false;
    }
    *out = values;
    *n = k;
    return true;
}

bool cli_take_value(int argc, char **argv, int *i, const char **value) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "kite: %s needs a value\n", argv[*i]);
        return false;
    }
    *i += 1;
    *value = argv[*i];
    return true;
}

bool cli_parse_backend(const char *text, kite_backend_kind *out) {
    if (strcmp(text, "auto") == 0) *out = KITE_BACKEND_AUTO;
    else if (strcmp(text, "cpu") == 0) *out = KITE_BACKEND_CPU;
    else if (strcmp(text, "cuda") == 0) *out = KITE_BACKEND_CUDA;
    else {
        fprintf(stderr, "kite: --backend: '%s' is not one of auto, cpu, cuda\n", text);
        return false;
    }
    return true;
}

cli_option_result cli_parse_engine_option(const char *option, const char *value, kite_load_params *load,
                                          kite_engine_params *engine) {
    long long v;
    if (strcmp(option, "--backend") == 0) return cli_parse_backend(value, &load->backend) ? CLI_OPTION_TAKEN : CLI_OPTION_BAD;
    if (strcmp(option, "--threads") == 0 || strcmp(option, "-t") == 0) {
        if (!cli_parse_int(option, value, 0, 4096, &v)) return CLI_OPTION_BAD;
        load->n_threads = (int32_t)v;
    } else if (strcmp(option, "--kv-cache-mb") == 0) {
        if (!cli_parse_int(option, value, 1, 1 << 30, &v)) return CLI_OPTION_BAD;
        engine->kv_cache_bytes = (size_t)v << 20;
    } else if (strcmp(option, "--max-batch") == 0) {
        if (!cli_parse_int(option, value, 1, 4096, &v)) return CLI_OPTION_BAD;
        engine->max_sequences = (int32_t)v;
    } else if (strcmp(option, "--max-step-tokens") == 0) {
        if (!cli_parse_int(option, value, 1, 1 << 20, &v)) return CLI_OPTION_BAD;
        engine->max_step_tokens = (int32_t)v;
    } else if (strcmp(option, "--max-context") == 0) {
        if (!cli_parse_int(option, value, 1, INT32_MAX, &v)) return CLI_OPTION_BAD;
        engine->max_context = (int32_t)v;
    } else {
        return CLI_OPTION_OTHER;
    }
    return CLI_OPTION_TAKEN;
}

cli_option_result cli_parse_sampling_option(const char *option, const char *value, kite_sampling *sampling) {
    long long iv;
    double fv;
    if (strcmp(option, "--temperature") == 0) {
        if (!cli_parse_float(option, value, 0.0, 100.0, &fv)) return CLI_OPTION_BAD;
        sampling->temperature = (float)fv;
    } else if (strcmp(option, "--top-k") == 0) {
        if (!cli_parse_int(option, value, 0, INT32_MAX, &iv)) return CLI_OPTION_BAD;
        sampling->top_k = (int32_t)iv;
    } else if (strcmp(option, "--top-p") == 0) {
        if (!cli_parse_float(option, value, 0.0, 1.0, &fv)) return CLI_OPTION_BAD;
        sampling->top_p = (float)fv;
    } else if (strcmp(option, "--min-p") == 0) {
        if (!cli_parse_float(option, value, 0.0, 1.0, &fv)) return CLI_OPTION_BAD;
        sampling->min_p = (float)fv;
    } else if (strcmp(option, "--repeat-penalty") == 0) {
        if (!cli_parse_float(option, value, 0.01, 100.0, &fv)) return CLI_OPTION_BAD;
        sampling->repetition_penalty = (float)fv;
    } else {
        return CLI_OPTION_OTHER;
    }
    return CLI_OPTION_TAKEN;
}

void json_write_string(FILE *out, const char *text, size_t length) {
    fputc('"', out);
    for (size_t i = 0; i < length; i++) {
        unsigned char c = (unsigned char)text[i];
        switch (c) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\r': fputs("\\r", out); break;
        case '\t': fputs("\\t", out); break;
        default:
            if (c < 0x20)
                fprintf(out, "\\u%04x", c);
            else
                fputc(c, out);
        }
    }
    fputc('"', out);
}

int cli_report(const char *what, kite_status status) {
    /* kite's messages already name the file, tensor or field; `what` only helps when there is none. */
    const char *message = kite_last_error();
    if (message[0])
        fprintf(stderr, "kite: %s\n", message);
    else
        fprintf(stderr, "kite: %s: %s\n", what, kite_status_string(status));
    return 1;
}

#include "cli_util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


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

bool cli_parse_weights(const char *text, kite_weights *out) {
    if (strcmp(text, "bf16") == 0) *out = KITE_WEIGHTS_BF16;
    else if (strcmp(text, "fp8") == 0) *out = KITE_WEIGHTS_FP8;
    else {
        fprintf(stderr, "kite: --weights: '%s' is not one of bf16, fp8\n", text);
        return false;
    }
    return true;
}

static bool parse_kv_cache_dtype(const char *name, const char *text, kite_kv_cache_dtype *out) {
    if (strcmp(text, "bf16") == 0) *out = KITE_KV_CACHE_BF16;
    else if (strcmp(text, "fp8") == 0) *out = KITE_KV_CACHE_FP8;
    else {
        fprintf(stderr, "kite: %s: '%s' is not one of bf16, fp8\n", name, text);
        return false;
    }
    return true;
}

/* The shared options' ranges, once: `name` is how messages call the option, `value` its text. */
static cli_option_result engine_option_set(int id, const char *name, const char *value, kite_load_params *load,
                                           kite_engine_params *engine) {
    long long v;
    switch (id) {
    case CLI_ID_BACKEND: return cli_parse_backend(value, &load->backend) ? CLI_OPTION_TAKEN : CLI_OPTION_BAD;
    case CLI_ID_WEIGHTS: return cli_parse_weights(value, &load->weights) ? CLI_OPTION_TAKEN : CLI_OPTION_BAD;
    case CLI_ID_KV_CACHE_DTYPE:
        return parse_kv_cache_dtype(name, value, &load->kv_cache_dtype) ? CLI_OPTION_TAKEN : CLI_OPTION_BAD;
    case CLI_ID_WEIGHT_CACHE:
        if (!value[0]) {
            fprintf(stderr, "kite: %s: give a folder or off\n", name);
            return CLI_OPTION_BAD;
        }
        load->weight_cache = value; /* argv outlives the load */
        return CLI_OPTION_TAKEN;
    case CLI_ID_THREADS:
        if (!cli_parse_int(name, value, 0, 4096, &v)) return CLI_OPTION_BAD;
        load->n_threads = (int32_t)v;
        return CLI_OPTION_TAKEN;
    case CLI_ID_KV_CACHE_MB:
        if (!cli_parse_int(name, value, 1, 1 << 30, &v)) return CLI_OPTION_BAD;
        if ((uint64_t)v > SIZE_MAX >> 20) { /* a 32-bit size_t holds less than the range above */
            fprintf(stderr, "kite: %s: %lld MiB does not fit in this machine's address space\n", name, v);
            return CLI_OPTION_BAD;
        }
        engine->kv_cache_bytes = (size_t)v << 20; /* whether memory holds it is the engine's check */
        return CLI_OPTION_TAKEN;
    case CLI_ID_MAX_BATCH:
        if (!cli_parse_int(name, value, 1, 4096, &v)) return CLI_OPTION_BAD;
        engine->max_sequences = (int32_t)v;
        return CLI_OPTION_TAKEN;
    case CLI_ID_MAX_STEP_TOKENS:
        if (!cli_parse_int(name, value, 1, 1 << 20, &v)) return CLI_OPTION_BAD;
        engine->max_step_tokens = (int32_t)v;
        return CLI_OPTION_TAKEN;
    case CLI_ID_MAX_CONTEXT: /* the model's limit, so the backend's RoPE table ends there too */
        if (!cli_parse_int(name, value, 1, INT32_MAX, &v)) return CLI_OPTION_BAD;
        load->max_context = (int32_t)v;
        return CLI_OPTION_TAKEN;
    case CLI_ID_NO_PREFIX_CACHE:
        engine->prefix_cache = false;
        return CLI_OPTION_TAKEN;
    case CLI_ID_ROPE_SCALING: /* argv outlives the load; the library validates it there */
        if (!value[0]) {
            fprintf(stderr, "kite: %s: empty; give a JSON object such as '{\"rope_type\":\"yarn\",\"factor\":4.0}'\n",
                    name);
            return CLI_OPTION_BAD;
        }
        load->rope_scaling = value;
        return CLI_OPTION_TAKEN;
    default: return CLI_OPTION_OTHER;
    }
}

static cli_option_result sampling_option_set(int id, const char *name, const char *value, kite_sampling *sampling) {
    long long iv;
    double fv;
    switch (id) {
    case CLI_ID_TEMPERATURE:
        if (!cli_parse_float(name, value, 0.0, 100.0, &fv)) return CLI_OPTION_BAD;
        sampling->temperature = (float)fv;
        return CLI_OPTION_TAKEN;
    case CLI_ID_TOP_K:
        if (!cli_parse_int(name, value, 0, INT32_MAX, &iv)) return CLI_OPTION_BAD;
        sampling->top_k = (int32_t)iv;
        return CLI_OPTION_TAKEN;
    case CLI_ID_TOP_P:
        if (!cli_parse_float(name, value, 0.0, 1.0, &fv)) return CLI_OPTION_BAD;
        sampling->top_p = (float)fv;
        return CLI_OPTION_TAKEN;
    case CLI_ID_MIN_P:
        if (!cli_parse_float(name, value, 0.0, 1.0, &fv)) return CLI_OPTION_BAD;
        sampling->min_p = (float)fv;
        return CLI_OPTION_TAKEN;
    case CLI_ID_REPEAT_PENALTY:
        if (!cli_parse_float(name, value, 0.01, 100.0, &fv)) return CLI_OPTION_BAD;
        sampling->repetition_penalty = (float)fv;
        return CLI_OPTION_TAKEN;
    default: return CLI_OPTION_OTHER;
    }
}

cli_option_result cli_take_engine_option(const cli_parser *p, kite_load_params *load, kite_engine_params *engine) {
    if (!p->option) return CLI_OPTION_OTHER;
    return engine_option_set(p->option->id, p->name, p->value ? p->value : "", load, engine);
}

cli_option_result cli_take_sampling_option(const cli_parser *p, kite_sampling *sampling) {
    if (!p->option) return CLI_OPTION_OTHER;
    return sampling_option_set(p->option->id, p->name, p->value ? p->value : "", sampling);
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

static const char *file_kind_name(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a plain file";
}

FILE *cli_open_regular(const char *what, const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        fprintf(stderr, "kite: %s: cannot open %s: %s\n", what, path, strerror(errno));
        return NULL;
    }
    struct stat st;
    int flags = -1;
    const char *problem = NULL;
    if (fstat(fd, &st) != 0)
        problem = "cannot stat";
    else if (!S_ISREG(st.st_mode)) {
        fprintf(stderr, "kite: %s: %s is not a regular file (%s)\n", what, path, file_kind_name(st.st_mode));
        close(fd);
        return NULL;
    } else if ((flags = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
        problem = "cannot clear O_NONBLOCK on";
    FILE *f = problem ? NULL : fdopen(fd, "rb");
    if (!f) {
        fprintf(stderr, "kite: %s: %s %s: %s\n", what, problem ? problem : "cannot open", path, strerror(errno));
        close(fd);
    }
    return f;
}

bool cli_read_file(const char *what, const char *path, size_t max_bytes, char **text, size_t *length) {
    *text = NULL;
    *length = 0;
    const bool from_stdin = strcmp(path, "-") == 0;
    FILE *f = from_stdin ? stdin : cli_open_regular(what, path);
    if (!f) return false;
    size_t capacity = 1 << 16, n = 0;
    char *buffer = malloc(capacity + 1);
    bool ok = buffer != NULL;
    while (ok) {
        if (n == capacity) {
            char *grown = capacity * 2 <= max_bytes + 1 ? realloc(buffer, capacity * 2 + 1) : NULL;
            if (!grown) {
                fprintf(stderr, "kite: %s: %s is larger than %zu bytes\n", what, from_stdin ? "standard input" : path,
                        max_bytes);
                ok = false;
                break;
            }
            buffer = grown;
            capacity *= 2;
        }
        const size_t got = fread(buffer + n, 1, capacity - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ok && n > max_bytes) {
        fprintf(stderr, "kite: %s: %s is larger than %zu bytes\n", what, from_stdin ? "standard input" : path,
                max_bytes);
        ok = false;
    }
    if (ok && ferror(f)) {
        fprintf(stderr, "kite: %s: error reading %s\n", what, from_stdin ? "standard input" : path);
        ok = false;
    }
    if (!buffer) fprintf(stderr, "kite: %s: out of memory\n", what);
    if (!from_stdin) fclose(f);
    if (!ok) {
        free(buffer);
        return false;
    }
    buffer[n] = '\0';
    *text = buffer;
    *length = n;
    return true;
}

/* ---- load progress ------------------------------------------------------------------------------------ */

static const char *stage_words(kite_load_stage stage) {
    switch (stage) {
    case KITE_LOAD_STAGE_CHECKPOINT: return "from the checkpoint";
    case KITE_LOAD_STAGE_CACHE_READ: return "from the weight cache";
    case KITE_LOAD_STAGE_CACHE_FILL: return "filling the weight cache";
    }
    return "loading";
}

static double gigabytes(uint64_t bytes) { return (double)bytes / 1e9; }
static double rate(uint64_t bytes, double seconds) { return seconds > 0 ? gigabytes(bytes) / seconds : 0.0; }

static void clear_live_line(cli_load_report *r) {
    if (!r->line_open) return;
    fputs("\r\033[K", stderr);
    r->line_open = false;
}

static void on_load_event(const kite_load_event *e, void *user_data) {
    cli_load_report *r = user_data;
    switch (e->kind) {
    case KITE_LOAD_EVENT_NOTICE:
        clear_live_line(r);
        fprintf(stderr, "kite: %s\n", e->message);
        return;
    case KITE_LOAD_EVENT_PROGRESS:
        if (!r->live) return;
        {
            double gbps = rate(e->bytes_done, e->seconds);
            double left = gbps > 0 && e->bytes_total > e->bytes_done ? gigabytes(e->bytes_total - e->bytes_done) / gbps
                                                                   : 0.0;
            fprintf(stderr, "\r\033[Kkite: weights %s: %.2f / %.2f GB, %.2f GB/s, %.0f s left", stage_words(e->stage),
                    gigabytes(e->bytes_done), gigabytes(e->bytes_total), gbps, left);
            r->line_open = true;
        }
        return;
    case KITE_LOAD_EVENT_DONE:
        clear_live_line(r);
        if (e->stage == KITE_LOAD_STAGE_CACHE_FILL) {
            r->have_fill = true;
            r->fill_bytes = e->bytes_done;
            r->fill_seconds = e->seconds;
        } else {
            r->have_source = true;
            r->source_stage = e->stage;
            r->source_bytes = e->bytes_done;
            r->source_seconds = e->seconds;
        }
        return;
    }
}

void cli_load_report_attach(cli_load_report *r, kite_load_params *load) {
    *r = (cli_load_report){.live = isatty(STDERR_FILENO) == 1};
    load->on_load_event = on_load_event;
    load->load_event_user_data = r;
}

void cli_load_report_finish(cli_load_report *r) {
    clear_live_line(r);
    if (!r->have_source) return;
    char fill[128] = "";
    if (r->have_fill)
        snprintf(fill, sizeof fill, "; weight cache filled with %.3f GB in %.2f s (%.2f GB/s)", gigabytes(r->fill_bytes),
                 r->fill_seconds, rate(r->fill_bytes, r->fill_seconds));
    fprintf(stderr, "kite: weights %s: %.3f GB in %.2f s (%.2f GB/s)%s\n", stage_words(r->source_stage),
            gigabytes(r->source_bytes), r->source_seconds, rate(r->source_bytes, r->source_seconds), fill);
}

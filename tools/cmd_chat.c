/* `kite chat`: a conversation with a checkpoint in the terminal, through its chat template.
 *
 * Each line read is a user turn (on a terminal after a "> " prompt; from a pipe, line after line); the answer
 * streams as it is generated, its reasoning dimmed (shown with --show-thinking), and joins the history, which the
 * template renders as it renders any conversation (Qwen3's drops the reasoning of earlier turns). Lines that
 * start with '/' are commands: /think and /no_think switch thinking mode, /reset starts over, /help lists them.
 * Ctrl-C stops the answer being generated (what it said so far stays in the history), not the session; EOF
 * (Ctrl-D) ends it. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "cli_options.h"
#include "cli_util.h"
#include "commands.h"
#include "kite.h"
#include "text_buffer.h"

enum {
    CHAT_MODEL = 1,
    CHAT_TEMPLATE_FILE,
    CHAT_SYSTEM,
    CHAT_NO_THINK,
    CHAT_SHOW_THINKING,
    CHAT_MAX_TOKENS,
    CHAT_SEED,
};

static const cli_option chat_options[] = {
    {CHAT_MODEL, "model", 'm', "DIR", "the checkpoint directory", false},
    {CHAT_TEMPLATE_FILE, "chat-template", 0, "FILE", "a .jinja file to use instead of the checkpoint's template",
     false},
    {CHAT_SYSTEM, "system", 's', "TEXT", "a system message that starts the conversation", false},
    {CHAT_NO_THINK, "no-think", 0, NULL, "start with thinking off (enable_thinking false; /think turns it on)", false},
    {CHAT_SHOW_THINKING, "show-thinking", 0, NULL, "print the reasoning too (dimmed on a terminal)", false},
    {CHAT_MAX_TOKENS, "max-tokens", 'n', "N", "tokens per answer at most (default 0 = until the turn ends)", false},
    {CHAT_SEED, "seed", 0, "S", "sampling seed of the first answer, S + 1 the next... (default: random)", false},
    CLI_SAMPLING_OPTIONS,
    CLI_ENGINE_OPTIONS,
};

static const cli_command chat_command = {
    "chat", "--model DIR [--no-think] [--show-thinking] [--system TEXT] [options]",
    "  A conversation in the terminal (or from a pipe: one user turn per line). Sampling follows the\n"
    "  checkpoint's generation_config.json unless an option sets it. Commands: /think, /no_think,\n"
    "  /reset, /help. Ctrl-C stops the current answer; Ctrl-D ends the session.\n",
    chat_options, sizeof chat_options / sizeof chat_options[0]};

static volatile sig_atomic_t interrupted;

static void on_interrupt(int signal_number) {
    (void)signal_number;
    interrupted = 1;
}

typedef struct answer {
    text_buffer content, reasoning;
    bool show_thinking, dim, in_reasoning;
    kite_finish_reason finish;
    bool done;
} answer;

static void set_dim(answer *a, bool reasoning) {
    if (!a->dim || a->in_reasoning == reasoning) return;
    fputs(reasoning ? "\x1b[2m" : "\x1b[0m", stdout);
    a->in_reasoning = reasoning;
}

static void on_chat_event(const kite_chat_event *event, void *user_data) {
    answer *a = user_data;
    const kite_chat_delta *d = &event->delta;
    if (d->reasoning_length) {
        text_buffer_append(&a->reasoning, d->reasoning, d->reasoning_length);
        if (a->show_thinking) {
            set_dim(a, true);
            fwrite(d->reasoning, 1, d->reasoning_length, stdout);
        }
    }
    if (d->content_length) {
        set_dim(a, false);
        /* The answer shows without the blank lines Qwen3 writes after its reasoning. */
        size_t skip = 0;
        if (a->content.length == 0)
            while (skip < d->content_length && d->content[skip] == '\n') skip++;
        text_buffer_append(&a->content, d->content + skip, d->content_length - skip);
        fwrite(d->content + skip, 1, d->content_length - skip, stdout);
    }
    fflush(stdout);
    if (event->finish != KITE_FINISH_NONE) {
        set_dim(a, false);
        a->finish = event->finish;
        a->done = true;
    }
}

/* The history: message objects as JSON text, in order. */
typedef struct history {
    char **messages;
    size_t n, capacity;
} history;

static bool history_add(history *h, const char *role, const char *content, size_t content_length,
                        const char *reasoning, size_t reasoning_length) {
    text_buffer b = {0};
    text_buffer_puts(&b, "{\"role\": ");
    text_buffer_json_string(&b, role, strlen(role));
    text_buffer_puts(&b, ", \"content\": ");
    text_buffer_json_string(&b, content, content_length);
    if (reasoning_length) {
        text_buffer_puts(&b, ", \"reasoning_content\": ");
        text_buffer_json_string(&b, reasoning, reasoning_length);
    }
    text_buffer_puts(&b, "}");
    if (!b.failed && h->n == h->capacity) {
        const size_t grown_capacity = h->capacity ? h->capacity * 2 : 16;
        char **grown = realloc(h->messages, grown_capacity * sizeof *grown);
        if (grown) {
            h->messages = grown;
            h->capacity = grown_capacity;
        }
    }
    if (b.failed || h->n == h->capacity) {
        text_buffer_free(&b);
        return false;
    }
    h->messages[h->n++] = b.data; /* the buffer's text, handed over */
    return true;
}

static void history_clear(history *h, size_t keep) {
    while (h->n > keep) free(h->messages[--h->n]);
}

static bool request_body(const history *h, bool thinking, text_buffer *out) {
    text_buffer_clear(out);
    text_buffer_puts(out, "{\"messages\": [");
    for (size_t i = 0; i < h->n; i++) {
        if (i) text_buffer_puts(out, ", ");
        text_buffer_puts(out, h->messages[i]);
    }
    text_buffer_printf(out, "], \"chat_template_kwargs\": {\"enable_thinking\": %s}}", thinking ? "true" : "false");
    return !out->failed;
}

static uint64_t random_seed(void) {
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed) seed = (uint64_t)getpid() ^ (uint64_t)time(NULL);
    return seed;
}

/* One answer to the conversation so far; false when it could not be generated (said on stderr). */
static bool generate_answer(kite_engine *engine, const kite_chat *chat, const char *body, size_t body_length,
                            const kite_request *base, answer *a) {
    kite_chat_prompt prompt;
    kite_status status = kite_chat_render(chat, body, body_length, &prompt);
    if (status != KITE_OK) {
        cli_report("chat", status);
        return false;
    }
    kite_request_id id = 0;
    interrupted = 0;
    status = kite_chat_submit(engine, chat, &prompt, base, on_chat_event, a, &id);
    kite_chat_prompt_free(&prompt);
    bool cancelled = false;
    while (status == KITE_OK && !a->done) {
        if (interrupted && !cancelled) {
            status = kite_engine_cancel(engine, id);
            cancelled = true;
        }
        if (status == KITE_OK) status = kite_engine_step(engine);
    }
    if (status != KITE_OK) {
        cli_report("chat", status);
        return false;
    }
    fputs("\n", stdout);
    if (a->finish == KITE_FINISH_CANCELLED) fprintf(stderr, "[stopped]\n");
    if (a->finish == KITE_FINISH_CAPACITY)
        fprintf(stderr, "[the conversation no longer fits the context: /reset starts over]\n");
    fflush(stdout);
    return true;
}

static void print_commands(void) {
    fprintf(stderr, "/think      thinking on (the model reasons before it answers)\n"
                    "/no_think   thinking off\n"
                    "/reset      forget the conversation (the --system message stays)\n"
                    "/help       this list; Ctrl-C stops an answer, Ctrl-D ends the session\n");
}

int cmd_chat(int argc, char **argv) {
    const char *model_dir = NULL, *template_path = NULL, *system = NULL;
    kite_load_params load = kite_load_params_default();
    kite_engine_params engine_params = kite_engine_params_default();
    kite_sampling chosen = kite_sampling_default();
    bool sampling_set[5] = {false}; /* temperature, top_k, top_p, min_p, repetition_penalty given */
    bool thinking = true, show_thinking = false, seed_given = false;
    int32_t max_tokens = 0;
    uint64_t seed = 0;
    cli_parser parser;
    cli_parser_init(&parser, &chat_command, argc, argv);
    for (int id; (id = cli_parser_next(&parser)) != CLI_END;) {
        long long iv;
        switch (id) {
        case CLI_HELP: return 0;
        case CLI_ERROR: return 2;
        case CHAT_MODEL: model_dir = parser.value; break;
        case CHAT_TEMPLATE_FILE: template_path = parser.value; break;
        case CHAT_SYSTEM: system = parser.value; break;
        case CHAT_NO_THINK: thinking = false; break;
        case CHAT_SHOW_THINKING: show_thinking = true; break;
        case CHAT_MAX_TOKENS:
            if (!cli_value_int(&parser, 0, INT32_MAX, &iv)) return 2;
            max_tokens = (int32_t)iv;
            break;
        case CHAT_SEED:
            if (!cli_value_int(&parser, 0, INT64_MAX, &iv)) return 2;
            seed = (uint64_t)iv;
            seed_given = true;
            break;
        default:
            if (cli_take_sampling_option(&parser, &chosen) == CLI_OPTION_TAKEN) {
                if (id >= CLI_ID_TEMPERATURE && id <= CLI_ID_REPEAT_PENALTY) sampling_set[id - CLI_ID_TEMPERATURE] = true;
                break;
            }
            if (cli_take_engine_option(&parser, &load, &engine_params) == CLI_OPTION_TAKEN) break;
            return 2;
        }
    }
    if (parser.first_argument < argc) {
        fprintf(stderr, "kite chat: unexpected argument '%s'\n", argv[parser.first_argument]);
        return 2;
    }
    if (!model_dir) {
        cli_print_usage(&chat_command, stderr);
        return 2;
    }

    kite_model *model = NULL;
    kite_engine *engine = NULL;
    kite_chat *own_chat = NULL;
    cli_load_report load_report;
    cli_load_report_attach(&load_report, &load);
    kite_status status = kite_model_load(model_dir, &load, &model);
    if (status != KITE_OK) return cli_report(model_dir, status);
    const kite_chat *chat = kite_model_chat(model);
    if (template_path) {
        status = kite_chat_load(model_dir, template_path, &own_chat);
        chat = own_chat;
    } else if (!chat) {
        fprintf(stderr, "kite chat: %s has no chat template (give one with --chat-template FILE)\n", model_dir);
        kite_model_free(model);
        return 1;
    }
    if (status == KITE_OK) status = kite_engine_create(model, &engine_params, &engine);
    if (status == KITE_OK) cli_load_report_finish(&load_report); /* a refused start says one line, the reason */
    if (status != KITE_OK) {
        int code = cli_report("chat", status);
        kite_chat_free(own_chat);
        kite_model_free(model);
        return code;
    }

    /* The checkpoint's sampling, with what the options set instead. */
    kite_sampling sampling = kite_chat_sampling_defaults(chat);
    if (sampling_set[0]) sampling.temperature = chosen.temperature;
    if (sampling_set[1]) sampling.top_k = chosen.top_k;
    if (sampling_set[2]) sampling.top_p = chosen.top_p;
    if (sampling_set[3]) sampling.min_p = chosen.min_p;
    if (sampling_set[4]) sampling.repetition_penalty = chosen.repetition_penalty;
    kite_request base = kite_request_default();
    base.sampling = sampling;
    base.max_tokens = max_tokens;

    struct sigaction action = {0};
    action.sa_handler = on_interrupt; /* no SA_RESTART: a read waiting at the prompt returns */
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, NULL);

    const bool terminal = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
    if (terminal)
        fprintf(stderr, "kite chat: %s, thinking %s. /help lists the commands; Ctrl-D ends.\n", model_dir,
                thinking ? "on" : "off");
    history h = {0};
    size_t keep = 0;
    int exit_code = 0;
    if (system && !history_add(&h, "system", system, strlen(system), NULL, 0)) exit_code = 1;
    keep = h.n;
    text_buffer body = {0};
    char *line = NULL;
    size_t line_capacity = 0;
    for (uint64_t turn = 0; exit_code == 0;) {
        if (terminal) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        errno = 0;
        ssize_t got = getline(&line, &line_capacity, stdin);
        if (got < 0) {
            if (errno == EINTR) { /* Ctrl-C at the prompt: a fresh prompt */
                clearerr(stdin);
                interrupted = 0;
                fputs("\n", stdout);
                continue;
            }
            if (terminal) fputs("\n", stdout);
            break;
        }
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = '\0';
        if (got == 0) continue;
        if ((size_t)got != strlen(line)) {
            fprintf(stderr, "kite chat: the line holds a NUL byte; it is not sent\n");
            continue;
        }
        if (line[0] == '/') {
            if (strcmp(line, "/think") == 0) {
                thinking = true;
            } else if (strcmp(line, "/no_think") == 0) {
                thinking = false;
            } else if (strcmp(line, "/reset") == 0) {
                history_clear(&h, keep);
            } else if (strcmp(line, "/help") == 0) {
                print_commands();
                continue;
            } else {
                fprintf(stderr, "kite chat: unknown command %s (/help lists them)\n", line);
                continue;
            }
            if (terminal) fprintf(stderr, "[thinking %s%s]\n", thinking ? "on" : "off",
                                  strcmp(line, "/reset") == 0 ? ", conversation reset" : "");
            continue;
        }
        if (!history_add(&h, "user", line, (size_t)got, NULL, 0) || !request_body(&h, thinking, &body)) {
            fprintf(stderr, "kite chat: out of memory\n");
            exit_code = 1;
            break;
        }
        answer a = {.show_thinking = show_thinking, .dim = isatty(STDOUT_FILENO)};
        base.sampling.seed = seed_given ? seed + turn : random_seed();
        turn++;
        if (!generate_answer(engine, chat, body.data, body.length, &base, &a)) {
            history_clear(&h, h.n - 1); /* the turn that failed is not part of the conversation */
        } else if (a.content.failed || a.reasoning.failed ||
                   !history_add(&h, "assistant", a.content.data ? a.content.data : "", a.content.length,
                                a.reasoning.data ? a.reasoning.data : "", a.reasoning.length)) {
            fprintf(stderr, "kite chat: out of memory\n");
            exit_code = 1;
        }
        text_buffer_free(&a.content);
        text_buffer_free(&a.reasoning);
    }
    free(line);
    text_buffer_free(&body);
    history_clear(&h, 0);
    free(h.messages);
    kite_engine_free(engine);
    kite_chat_free(own_chat);
    kite_model_free(model);
    return exit_code;
}

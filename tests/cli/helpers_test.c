/* The CLI's own helpers, alone: the text buffer's JSON writer and the option table's parsing and usage. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_options.h"
#include "test_util.h"
#include "text_buffer.h"

static void test_json_string_escapes(void) {
    text_buffer b = {0};
    const char text[] = "a\"b\\c\nd\re\tf\x01g\x1f\x7f\xc3\xa9\0z";
    text_buffer_json_string(&b, text, sizeof text - 1);
    const char want[] = "\"a\\\"b\\\\c\\nd\\re\\tf\\u0001g\\u001f\x7f\xc3\xa9\\u0000z\"";
    CHECK(!b.failed);
    CHECK_MSG(b.length == sizeof want - 1 && memcmp(b.data, want, b.length) == 0, "got %s", b.data);
    text_buffer_clear(&b);
    text_buffer_json_string(&b, "", 0);
    CHECK(b.length == 2 && strcmp(b.data, "\"\"") == 0);
    text_buffer_free(&b);
    CHECK(b.data == NULL && b.length == 0);
}

static void test_json_numbers(void) {
    text_buffer b = {0};
    text_buffer_json_general(&b, -7.826646328, 9);
    text_buffer_puts(&b, ",");
    text_buffer_json_fixed(&b, 0.5, 3);
    text_buffer_puts(&b, ",");
    text_buffer_json_general(&b, -INFINITY, 9);
    text_buffer_puts(&b, ",");
    text_buffer_json_fixed(&b, NAN, 3);
    text_buffer_puts(&b, ",");
    int32_t ids[] = {1, -2, 151643};
    text_buffer_json_int_array(&b, ids, 3);
    text_buffer_json_int_array(&b, ids, 0);
    CHECK_MSG(strcmp(b.data, "-7.82664633,0.500,null,null,[1,-2,151643][]") == 0, "got %s", b.data);
    text_buffer_free(&b);
}

static void test_printf_grows(void) {
    text_buffer b = {0};
    char long_text[3000];
    memset(long_text, 'x', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = '\0';
    for (int i = 0; i < 10; i++) text_buffer_printf(&b, "%d:%s;", i, long_text);
    CHECK(!b.failed);
    CHECK(b.length == 10 * (2 + 2999 + 1));
    CHECK(strlen(b.data) == b.length);
    CHECK(strncmp(b.data + 3002, "1:xx", 4) == 0);
    text_buffer_free(&b);
}

enum { OPT_MODEL = 1, OPT_COUNT, OPT_STOP, OPT_JSON, OPT_LIST, OPT_RATE };

static const cli_option options[] = {
    {OPT_MODEL, "model", 'm', "DIR", "the model", false},
    {OPT_COUNT, "count", 'n', "N", "how many", false},
    {OPT_STOP, "stop", 0, "STR", "a stop string", true},
    {OPT_JSON, "json", 0, NULL, "print JSON", false},
    {OPT_LIST, NULL, 'b', "B,B,...", "a list\nover two lines", false},
    {OPT_RATE, "rate", 0, "R", "a rate", false},
};
static const cli_command command = {"test", "--model DIR [options] ARG...", "  A test command.\n", options,
                                    sizeof options / sizeof options[0]};

/* Parses a command line (argv[0] is the command); returns the ids seen, the last CLI_* result in *end. */
static int parse(int argc, char **argv, cli_parser *p, int *ids, int max_ids) {
    cli_parser_init(p, &command, argc, argv);
    int n = 0, id;
    while ((id = cli_parser_next(p)) > 0) {
        if (n < max_ids) ids[n] = id;
        n++;
    }
    return id == CLI_END ? n : id;
}

static void test_options_parse(void) {
    char *argv[] = {"test", "first", "-m", "dir", "--count=3", "--stop", "a", "--stop", "b", "--json",
                    "-b1,2", "second", "--", "--not-an-option", NULL};
    int argc = (int)(sizeof argv / sizeof argv[0]) - 1;
    cli_parser p;
    cli_parser_init(&p, &command, argc, argv);
    const char *stops[4];
    int n_stops = 0;
    const char *model = NULL;
    long long count = 0;
    bool json = false;
    int32_t *list = NULL;
    size_t n_list = 0;
    int id;
    while ((id = cli_parser_next(&p)) > 0) {
        switch (id) {
        case OPT_MODEL:
            model = p.value;
            CHECK(strcmp(p.name, "--model") == 0);
            break;
        case OPT_COUNT: CHECK(cli_value_int(&p, 0, 10, &count)); break;
        case OPT_STOP: stops[n_stops++] = p.value; break;
        case OPT_JSON: json = p.value == NULL; break;
        case OPT_LIST:
            CHECK(strcmp(p.name, "-b") == 0);
            CHECK(cli_value_int_list(&p, 0, 5, &list, &n_list));
            break;
        default: CHECK_MSG(false, "unexpected id %d", id);
        }
    }
    CHECK(id == CLI_END);
    CHECK(model && strcmp(model, "dir") == 0);
    CHECK(count == 3 && json);
    CHECK(n_stops == 2 && strcmp(stops[0], "a") == 0 && strcmp(stops[1], "b") == 0);
    CHECK(n_list == 2 && list && list[0] == 1 && list[1] == 2);
    free(list);
    /* The positional arguments, in order, after the options. */
    CHECK(argc - p.first_argument == 3);
    CHECK(strcmp(argv[p.first_argument], "first") == 0);
    CHECK(strcmp(argv[p.first_argument + 1], "second") == 0);
    CHECK(strcmp(argv[p.first_argument + 2], "--not-an-option") == 0);
}

static void test_options_errors(void) {
    cli_parser p;
    int ids[8];
    char *unknown[] = {"test", "--bogus", NULL};
    CHECK(parse(2, unknown, &p, ids, 8) == CLI_ERROR);
    char *unknown_short[] = {"test", "-z", NULL};
    CHECK(parse(2, unknown_short, &p, ids, 8) == CLI_ERROR);
    char *missing[] = {"test", "--model", NULL};
    CHECK(parse(2, missing, &p, ids, 8) == CLI_ERROR);
    char *flag_value[] = {"test", "--json=1", NULL};
    CHECK(parse(2, flag_value, &p, ids, 8) == CLI_ERROR);
    char *help[] = {"test", "-m", "x", "--help", NULL};
    CHECK(parse(4, help, &p, ids, 8) == CLI_HELP);
    char *again[] = {"test", "--json", "-n", "4", NULL};
    CHECK(parse(4, again, &p, ids, 8) == 2 && ids[0] == OPT_JSON && ids[1] == OPT_COUNT);
}

static void test_option_values(void) {
    cli_parser p;
    char *argv[] = {"test", "--count", "11", "--rate", "0.5", "--count", "x", "--rate", "nan", "-b", "1,,9", NULL};
    cli_parser_init(&p, &command, 11, argv);
    long long v;
    double d;
    int32_t *list = NULL;
    size_t n = 0;
    CHECK(cli_parser_next(&p) == OPT_COUNT && !cli_value_int(&p, 0, 10, &v));
    CHECK(cli_parser_next(&p) == OPT_RATE && cli_value_float(&p, 0, 1, &d) && d == 0.5);
    CHECK(cli_parser_next(&p) == OPT_COUNT && !cli_value_int(&p, 0, 10, &v));
    CHECK(cli_parser_next(&p) == OPT_RATE && !cli_value_float(&p, 0, 1, &d));
    CHECK(cli_parser_next(&p) == OPT_LIST && !cli_value_int_list(&p, 0, 5, &list, &n) && list == NULL);
    CHECK(cli_parser_next(&p) == CLI_END);
    const char *const choices[] = {"md", "jsonl", NULL};
    char *choice_argv[] = {"test", "--model", "jsonl", "--model", "xml", NULL};
    cli_parser_init(&p, &command, 5, choice_argv);
    int which = -1;
    CHECK(cli_parser_next(&p) == OPT_MODEL && cli_value_choice(&p, choices, &which) && which == 1);
    CHECK(cli_parser_next(&p) == OPT_MODEL && !cli_value_choice(&p, choices, &which) && which == 1);
}

static void test_usage_is_the_table(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/kite-cli-usage-%d.txt", (int)getpid());
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    cli_print_usage(&command, f);
    fclose(f);
    char *text = test_read_file(path, NULL);
    remove(path);
    CHECK(text != NULL);
    if (!text) return;
    CHECK_MSG(strncmp(text, "usage: kite test --model DIR [options] ARG...\n  A test command.\n", 63) == 0, "%s", text);
    CHECK(strstr(text, "\n  -m, --model DIR         the model\n") != NULL);
    CHECK(strstr(text, "\n      --stop STR          a stop string (repeatable)\n") != NULL);
    CHECK(strstr(text, "\n  -b B,B,...              a list\n                          over two lines\n") != NULL);
    CHECK(strstr(text, "\n  -h, --help              print this help\n") != NULL);
    free(text);
}

int main(void) {
    TEST_RUN(test_json_string_escapes);
    TEST_RUN(test_json_numbers);
    TEST_RUN(test_printf_grows);
    TEST_RUN(test_options_parse);
    TEST_RUN(test_options_errors);
    TEST_RUN(test_option_values);
    TEST_RUN(test_usage_is_the_table);
    return test_finish();
}

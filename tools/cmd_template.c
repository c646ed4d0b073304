/* `kite template`: a chat request rendered with a checkpoint's chat template, exactly the prompt `kite serve`
 * and `kite chat` give the model. Only the tokenizer files are read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_options.h"
#include "cli_util.h"
#include "commands.h"
#include "kite.h"
#include "text_buffer.h"

#define REQUEST_MAX_BYTES ((size_t)64 << 20)

enum { TEMPLATE_MODEL = 1, TEMPLATE_REQUEST, TEMPLATE_CHAT_TEMPLATE, TEMPLATE_JSON };

static const cli_option template_options[] = {
    {TEMPLATE_MODEL, "model", 'm', "DIR", "the checkpoint directory (only its tokenizer files are read)", false},
    {TEMPLATE_REQUEST, "request", 'r', "FILE",
     "a /v1/chat/completions request body (messages, tools, add_generation_prompt,\nchat_template_kwargs); \"-\" "
     "reads standard input",
     false},
    {TEMPLATE_CHAT_TEMPLATE, "chat-template", 0, "FILE", "a .jinja file to use instead of the checkpoint's template",
     false},
    {TEMPLATE_JSON, "json", 0, NULL,
     "print {\"text\": \"...\", \"ids\": [...]}, with \"insert_after\" and \"insert_ids\"\nwhen a forced tool "
     "call's opening follows the model's </think>",
     false},
};

static const cli_command template_command = {
    "template", "--model DIR --request FILE [--chat-template FILE] [--json]",
    "  Prints the prompt the chat template renders for the request (no newline is added), or the\n"
    "  prompt and its token ids as one JSON object with --json.\n",
    template_options, sizeof template_options / sizeof template_options[0]};

int cmd_template(int argc, char **argv) {
    const char *model = NULL, *request_path = NULL, *template_path = NULL;
    bool json = false;
    cli_parser parser;
    cli_parser_init(&parser, &template_command, argc, argv);
    for (int id; (id = cli_parser_next(&parser)) != CLI_END;) {
        switch (id) {
        case CLI_HELP: return 0;
        case TEMPLATE_MODEL: model = parser.value; break;
        case TEMPLATE_REQUEST: request_path = parser.value; break;
        case TEMPLATE_CHAT_TEMPLATE: template_path = parser.value; break;
        case TEMPLATE_JSON: json = true; break;
        default: return 2;
        }
    }
    if (parser.first_argument < argc) {
        fprintf(stderr, "kite template: unexpected argument '%s'\n", argv[parser.first_argument]);
        return 2;
    }
    if (!model || !request_path) {
        cli_print_usage(&template_command, stderr);
        return 2;
    }
    char *request = NULL;
    size_t request_length = 0;
    if (!cli_read_file("--request", request_path, REQUEST_MAX_BYTES, &request, &request_length)) return 1;
    kite_chat *chat = NULL;
    kite_status status = kite_chat_load(model, template_path, &chat);
    kite_chat_prompt prompt = {0};
    if (status == KITE_OK) status = kite_chat_render(chat, request, request_length, &prompt);
    free(request);
    kite_chat_free(chat);
    if (status != KITE_OK) return cli_report("template", status);
    text_buffer out = {0};
    if (json) {
        text_buffer_puts(&out, "{\"text\": ");
        text_buffer_json_string(&out, prompt.text, prompt.length);
        text_buffer_puts(&out, ", \"ids\": ");
        text_buffer_json_int_array(&out, prompt.ids, prompt.n_ids);
        if (prompt.n_insert_ids > 0) { /* a forced tool call after the model's reasoning: what the engine inserts */
            text_buffer_printf(&out, ", \"insert_after\": %d, \"insert_ids\": ", (int)prompt.insert_after);
            text_buffer_json_int_array(&out, prompt.insert_ids, prompt.n_insert_ids);
        }
        text_buffer_puts(&out, "}\n");
    } else {
        text_buffer_append(&out, prompt.text, prompt.length);
    }
    kite_chat_prompt_free(&prompt);
    const bool written = text_buffer_write(&out, stdout) && fflush(stdout) == 0;
    text_buffer_free(&out);
    if (!written) {
        fprintf(stderr, "kite template: cannot write the output\n");
        return 1;
    }
    return 0;
}

#!/usr/bin/env python3
"""Makes the golden renderings of kite's chat-template corpus.

For every template tests/data/chat/templates/NAME.jinja and every conversation
tests/data/chat/conversations/NN-short-name.json (an OpenAI /v1/chat/completions request body as vLLM
accepts it: messages, tools, add_generation_prompt, chat_template_kwargs) it writes

    OUT/NAME/NN-short-name.txt        the rendered prompt, the exact characters as UTF-8, nothing added
    OUT/NAME/NN-short-name.ids.json   the token ids of that prompt (transformers mode only)
    OUT/NAME/NN-short-name.error.txt  "ExceptionType: message" when the template raises

Messages are first prepared as vLLM prepares a request's (prepare_message): kite renders the same prepared
messages, so the goldens are transformers' rendering of what a server hands the template.

Default mode renders with transformers exactly as a user would:
    tok = AutoTokenizer.from_pretrained("tests/data/tokenizer")
    tok.apply_chat_template(messages, tools=tools, add_generation_prompt=..., tokenize=False,
                            chat_template=TEMPLATE_TEXT, **chat_template_kwargs)
and again with tokenize=True, return_dict=False for the ids.

--jinja2 mode needs only jinja2: it reproduces transformers' render_jinja_template
(src/transformers/utils/chat_template_utils.py): an ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True, extensions=[loopcontrols]), tojson = json.dumps(ensure_ascii=False, ...), globals
raise_exception and strftime_now, rendered with messages, tools, documents=None, add_generation_prompt and
the tokenizer's special tokens (from tokenizer_config.json) overridden by the chat_template_kwargs. It writes
no ids (tokenizing needs the tokenizers library).

Usage, from the repository root:
    python3 tests/data/tools/make_chat_goldens.py [--jinja2] [--out DIR]
The default OUT is tests/data/chat/goldens. Template files are read as they are (bytes decoded as UTF-8,
no newline stripped), as transformers reads a chat_template.jinja.
"""

import argparse
import copy
import json
import os
import sys
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.dirname(HERE)
TEMPLATES = os.path.join(DATA, "chat", "templates")
CONVERSATIONS = os.path.join(DATA, "chat", "conversations")
TOKENIZER = os.path.join(DATA, "tokenizer")

# The request fields a conversation may hold; anything else is refused rather than silently ignored.
KNOWN_FIELDS = {"messages", "tools", "add_generation_prompt", "chat_template_kwargs"}

# transformers' SPECIAL_TOKENS_ATTRIBUTES: special_tokens_map holds those that are set.
SPECIAL_TOKEN_FIELDS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                        "mask_token", "additional_special_tokens"]


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8")


def load_templates():
    names = sorted(n for n in os.listdir(TEMPLATES) if n.endswith(".jinja"))
    if not names:
        sys.exit(f"no templates in {TEMPLATES}")
    return [(n[: -len(".jinja")], read_text(os.path.join(TEMPLATES, n))) for n in names]


def load_conversations():
    names = sorted(n for n in os.listdir(CONVERSATIONS) if n.endswith(".json"))
    if not names:
        sys.exit(f"no conversations in {CONVERSATIONS}")
    out = []
    for n in names:
        path = os.path.join(CONVERSATIONS, n)
        body = json.loads(read_text(path))
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            sys.exit(f"{path}: not an object with a messages list")
        unknown = set(body) - KNOWN_FIELDS
        if unknown:
            sys.exit(f"{path}: fields this script does not render: {sorted(unknown)}")
        kwargs = body.get("chat_template_kwargs", {})
        if not isinstance(kwargs, dict):
            sys.exit(f"{path}: chat_template_kwargs is not an object")
        out.append((n[: -len(".json")], body))
    return out


def prepare_message(message):
    """A message as vLLM prepares it before the template sees it (and as kite's chat_format.c does): content
    that is null or absent becomes "", a list of text parts is joined with "\n", and an assistant tool call's
    arguments given as a JSON string are parsed into their object ("" or absent: {})."""
    m = copy.deepcopy(message)
    content = m.get("content")
    if content is None:
        m["content"] = ""
    elif isinstance(content, list):
        m["content"] = "\n".join(part["text"] for part in content)
    for call in m.get("tool_calls") or []:
        function = call.get("function", {})
        arguments = function.get("arguments")
        if not arguments:
            function["arguments"] = {}
        elif isinstance(arguments, str):
            function["arguments"] = json.loads(arguments)
    return m


def request_args(body):
    """What vLLM hands to apply_chat_template for a request body: the prepared messages, the tools (an empty
    list offers none), add_generation_prompt (default true) and the chat_template_kwargs."""
    return ([prepare_message(m) for m in body["messages"]], body.get("tools") or None,
            body.get("add_generation_prompt", True), dict(body.get("chat_template_kwargs", {})))


def write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)


def write_result(out_dir, name, text, ids, error):
    for suffix in (".txt", ".ids.json", ".error.txt"):
        p = os.path.join(out_dir, name + suffix)
        if os.path.exists(p):
            os.remove(p)
    if error is not None:
        write_bytes(os.path.join(out_dir, name + ".error.txt"), error.encode("utf-8"))
        return
    write_bytes(os.path.join(out_dir, name + ".txt"), text.encode("utf-8"))
    if ids is not None:
        write_bytes(os.path.join(out_dir, name + ".ids.json"), (json.dumps(ids) + "\n").encode("utf-8"))


def describe(exc):
    return f"{type(exc).__name__}: {exc}"


class TransformersRenderer:
    def __init__(self):
        import transformers
        from transformers import AutoTokenizer
        self.tok = AutoTokenizer.from_pretrained(TOKENIZER)
        self.versions = {"mode": "transformers", "transformers": transformers.__version__}
        import jinja2
        self.versions["jinja2"] = jinja2.__version__

    def render(self, template, body):
        messages, tools, agp, kwargs = request_args(body)
        text = self.tok.apply_chat_template(copy.deepcopy(messages), tools=copy.deepcopy(tools),
                                            add_generation_prompt=agp, tokenize=False,
                                            chat_template=template, **kwargs)
        ids = self.tok.apply_chat_template(copy.deepcopy(messages), tools=copy.deepcopy(tools),
                                           add_generation_prompt=agp, tokenize=True, return_dict=False,
                                           chat_template=template, **kwargs)
        if hasattr(ids, "keys"):  # a BatchEncoding where a transformers version ignores return_dict=False
            ids = ids["input_ids"]
        ids = [int(i) for i in ids]
        return text, ids

    def encode(self, text):
        return [int(i) for i in self.tok(text, add_special_tokens=False)["input_ids"]]


class Jinja2Renderer:
    def __init__(self):
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        self.jinja2 = jinja2
        self.env_class = ImmutableSandboxedEnvironment
        self.versions = {"mode": "jinja2", "jinja2": jinja2.__version__}
        config = json.loads(read_text(os.path.join(TOKENIZER, "tokenizer_config.json")))
        self.special = {}
        for field in SPECIAL_TOKEN_FIELDS:
            value = config.get(field)
            if isinstance(value, dict):  # an AddedToken written out as {"content": ..., ...}
                value = value.get("content")
            if isinstance(value, list):
                value = [v.get("content") if isinstance(v, dict) else v for v in value]
            if value:
                self.special[field] = value
        self.compiled = {}

    def compile(self, template):
        if template in self.compiled:
            return self.compiled[template]
        jinja2 = self.jinja2

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        def strftime_now(format):
            return datetime.now().strftime(format)

        env = self.env_class(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        compiled = env.from_string(template)
        self.compiled[template] = compiled
        return compiled

    def render(self, template, body):
        messages, tools, agp, kwargs = request_args(body)
        template_kwargs = {**self.special, **kwargs}
        text = self.compile(template).render(messages=copy.deepcopy(messages), tools=copy.deepcopy(tools),
                                             documents=None, add_generation_prompt=agp, **template_kwargs)
        return text, None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jinja2", action="store_true", help="render with plain jinja2, no transformers")
    parser.add_argument("--out", default=os.path.join(DATA, "chat", "goldens"), help="output folder")
    args = parser.parse_args()

    renderer = Jinja2Renderer() if args.jinja2 else TransformersRenderer()
    templates = load_templates()
    conversations = load_conversations()
    os.makedirs(args.out, exist_ok=True)
    write_bytes(os.path.join(args.out, "VERSIONS.json"),
                (json.dumps(renderer.versions, indent=1, sort_keys=True) + "\n").encode("utf-8"))

    for tname, template in templates:
        out_dir = os.path.join(args.out, tname)
        os.makedirs(out_dir, exist_ok=True)
        errors = []
        for cname, body in conversations:
            text, ids, error = None, None, None
            try:
                text, ids = renderer.render(template, body)
            except Exception as exc:  # a template that raises is a golden too
                error = describe(exc)
                errors.append(cname)
            if ids is not None and renderer.encode(text) != ids:
                # Possible when content holds special-token text and transformers sanitizes it.
                print(f"  note: {tname}/{cname}: apply_chat_template's ids differ from encoding its text",
                      file=sys.stderr)
            write_result(out_dir, cname, text, ids, error)
        rendered = len(conversations) - len(errors)
        line = f"{tname}: {rendered} rendered, {len(errors)} raised"
        if errors:
            line += " (" + ", ".join(errors) + ")"
        print(line)


if __name__ == "__main__":
    main()

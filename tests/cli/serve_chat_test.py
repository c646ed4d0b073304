#!/usr/bin/env python3
"""`kite serve`'s /v1/chat/completions with tool_choice "required" and a named function, and with logprobs
(issue 37, item 2), streamed and not, over loopback on the CPU backend:

  - on the scripted checkpoint (tests/common/scripted_checkpoint.py), whose answers are written by its script:
    a forced choice gives the call the script continues the forced opening with, the named function's name
    whatever the model would have called, a call to a tool the request does not offer is text (never a made-up
    call), finish_reason as OpenAI's ("tool_calls" for required, "stop" for a named function), the forced
    tokens counted as prompt and carrying no logprobs; with thinking on (the default) the script reasons first
    ("<think>ok</think>") and the opening is inserted after its </think>: reasoning_content, then the call;
  - on the tiny checkpoint: chat logprobs equal /v1/completions' on the rendered prompt's ids (the same engine
    numbers), the bytes of the tokens add up to the answer's text, and the streamed chunks' logprobs add up to
    the whole answer's, and a client that leaves such a stream is cancelled with nothing left behind;
  - unknown names, missing tools and malformed shapes are 400 naming the field."""
import argparse, http.client, json, os, socket, subprocess, sys, tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--kite", required=True)
ap.add_argument("--data", required=True)
args = ap.parse_args()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from cases import case, finish  # noqa: E402
from kite_server import KiteServer  # noqa: E402
import scripted_checkpoint  # noqa: E402

TINY = os.path.join(args.data, "tiny")
folder = tempfile.TemporaryDirectory()
SCRIPTED = os.path.join(folder.name, "scripted")
scripted_checkpoint.write_scripted_checkpoint(TINY, SCRIPTED)
try:
    servers = {"scripted": KiteServer(args.kite, SCRIPTED), "tiny": KiteServer(args.kite, TINY)}
except RuntimeError as e:
    print(e)
    print("0 passed, 1 failed")
    sys.exit(1)


def post(server, path, body, stream=False):
    c = http.client.HTTPConnection("127.0.0.1", servers[server].port, timeout=120)
    c.request("POST", path, body=json.dumps(dict(body, stream=True) if stream else body))
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def chat(server, body):
    status, data = post(server, "/v1/chat/completions", body)
    assert status == 200, (status, data)
    return json.loads(data)


def chat_stream(server, body):
    """The chunks of a streamed answer (after checking the stream ends with [DONE])."""
    status, data = post(server, "/v1/chat/completions", body, stream=True)
    assert status == 200, (status, data)
    events = [e[len("data: "):] for e in data.decode().split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    return [json.loads(e) for e in events[:-1]]


def joined(chunks):
    """The streamed deltas put together as a message, the finish_reason and the logprobs' content."""
    message, finish_reason, logprobs = {"content": "", "reasoning_content": "", "tool_calls": []}, None, None
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant", chunks[0]
    for c in chunks:
        choice = c["choices"][0]
        delta = choice["delta"]
        message["content"] += delta.get("content", "")
        message["reasoning_content"] += delta.get("reasoning_content", "")
        message["tool_calls"] += delta.get("tool_calls", [])
        if choice["logprobs"] is not None:
            logprobs = (logprobs or []) + choice["logprobs"]["content"]
        assert finish_reason is None, "a chunk after the one with finish_reason"
        finish_reason = choice["finish_reason"]
    return message, finish_reason, logprobs


def rendered_ids(body):
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(body, f)
        f.flush()
        p = subprocess.run([args.kite, "template", "--model", TINY, "--request", f.name, "--json"],
                           capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["ids"]


def error_of(status, data):
    return status, json.loads(data)["error"]


def tool(name):
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    return {"type": "function", "function": {"name": name, "description": "A tool.", "parameters": parameters}}


def named(name):
    return {"type": "function", "function": {"name": name}}


WEATHER, LOOKUP = tool("get_weather"), tool("lookup")
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
PARIS = {"city": "Paris"}


def tokens_of(text):
    status, data = post("scripted", "/tokenize", {"prompt": text})
    assert status == 200, data
    return json.loads(data)["count"]


# What the script writes before a forced opening inserted after its reasoning: <think>, ok, </think>.
THOUGHT, THOUGHT_TOKENS = "ok", 3


def opening(name=None):
    return '<tool_call>\n{"name": "' + (name + '", "arguments":' if name else "")


def check_forced(body, name, finish_reason, generated, reasoning=None, inserted=0):
    """A forced choice's answer, whole and streamed (the same seed gives the same call id): one call to `name`
    with the script's arguments, no text, and `reasoning` (None: none). `inserted`: the tokens of the opening
    the engine inserted after the reasoning, which usage counts as prompt."""
    whole = chat("scripted", body)
    choice = whole["choices"][0]
    message = choice["message"]
    assert choice["finish_reason"] == finish_reason, choice
    assert message["content"] is None and message.get("reasoning_content") == reasoning, message
    calls = message["tool_calls"]
    assert len(calls) == 1 and calls[0]["type"] == "function" and calls[0]["function"]["name"] == name, calls
    assert json.loads(calls[0]["function"]["arguments"]) == PARIS, calls
    assert calls[0]["id"].startswith("chatcmpl-tool-") and len(calls[0]["id"]) == 14 + 32, calls
    # The forced opening is prompt: usage counts it there, and only what the model wrote is completion.
    assert whole["usage"]["completion_tokens"] == generated, whole["usage"]
    assert whole["usage"]["prompt_tokens"] == len(rendered_ids(body)) + inserted, whole["usage"]
    streamed, streamed_finish, _ = joined(chat_stream("scripted", body))
    assert streamed_finish == finish_reason, streamed_finish
    assert streamed["content"] == "" and streamed["reasoning_content"] == (reasoning or ""), streamed
    assert streamed["tool_calls"] == [dict(calls[0], index=0)], (streamed["tool_calls"], calls)
    return whole


@case
def auto_lets_the_script_call_its_tool():
    """The baseline the forced choices are measured against: with tool_choice auto the script thinks, writes
    text and calls get_weather."""
    out = chat("scripted", {"messages": QUESTION, "tools": [WEATHER], "temperature": 0})
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    assert choice["message"]["reasoning_content"] == "ok" and choice["message"]["content"] == "Sure", choice
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == PARIS, choice
    assert out["usage"]["completion_tokens"] == scripted_checkpoint.ANSWER_TOKENS, out["usage"]


@case
def required_starts_the_answer_with_a_call():
    body = {"messages": QUESTION, "tools": [WEATHER, LOOKUP], "tool_choice": "required", "temperature": 0, "seed": 5}
    # Thinking off: the prompt ends with the opening, after the template's empty think block.
    no_thinking = dict(body, chat_template_kwargs={"enable_thinking": False})
    check_forced(no_thinking, "get_weather", "tool_calls", scripted_checkpoint.REQUIRED_TOKENS)
    # Thinking on (the default, or asked for): the prompt is auto's, the script reasons, then the call.
    inserted = tokens_of("\n\n" + opening())
    for thinking in (body, dict(body, chat_template_kwargs={"enable_thinking": True})):
        check_forced(thinking, "get_weather", "tool_calls", THOUGHT_TOKENS + scripted_checkpoint.REQUIRED_TOKENS,
                     THOUGHT, inserted)
        auto = dict(thinking, tool_choice="auto")
        assert rendered_ids(thinking) == rendered_ids(auto) != rendered_ids(no_thinking)


@case
def a_named_function_is_called_whatever_the_model_would_call():
    body = {"messages": QUESTION, "tools": [WEATHER, LOOKUP], "tool_choice": named("get_weather"), "temperature": 0,
            "seed": 6}
    no_thinking = dict(body, chat_template_kwargs={"enable_thinking": False})
    check_forced(no_thinking, "get_weather", "stop", scripted_checkpoint.NAMED_TOKENS)
    # The script would call get_weather; named lookup, the name is kite's and the arguments the model's.
    check_forced(dict(no_thinking, tool_choice=named("lookup")), "lookup", "stop", scripted_checkpoint.NAMED_TOKENS)
    # With thinking, after the script's reasoning.
    for name in ("get_weather", "lookup"):
        check_forced(dict(body, tool_choice=named(name)), name, "stop",
                     THOUGHT_TOKENS + scripted_checkpoint.NAMED_TOKENS, THOUGHT, tokens_of("\n\n" + opening(name)))


@case
def a_call_to_a_tool_not_offered_is_text():
    """Under "required" the script names get_weather, which this request does not offer: the call is malformed
    (what tool_choice auto gives for one: its text, tags included, as content), never a call."""
    body = {"messages": QUESTION, "tools": [LOOKUP], "tool_choice": "required", "temperature": 0}
    text = '<tool_call>\n{"name": "get_weather","arguments": {"city":"Paris"}}</tool_call>'
    for thinking in (True, False):  # with thinking, the inserted "\n\n" before the opening is not content either
        request = dict(body, chat_template_kwargs={"enable_thinking": thinking})
        out = chat("scripted", request)
        choice = out["choices"][0]
        assert choice["message"]["content"] == text and "tool_calls" not in choice["message"], choice
        assert choice["message"].get("reasoning_content") == (THOUGHT if thinking else None), choice
        assert choice["finish_reason"] == "stop", choice
        streamed, streamed_finish, _ = joined(chat_stream("scripted", request))
        assert streamed["content"] == text and streamed["tool_calls"] == [] and streamed_finish == "stop", streamed


@case
def forced_choices_are_checked():
    bad = [({"tools": [WEATHER], "tool_choice": named("get_time")}, "tool_choice", "get_time"),
           ({"tool_choice": "required"}, "tool_choice", "needs tools"),
           ({"tools": [], "tool_choice": named("get_weather")}, "tool_choice", "needs tools"),
           ({"tools": [WEATHER], "tool_choice": "any"}, "tool_choice", "required"),
           ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice", "name"),
           ({"tools": [WEATHER], "tool_choice": {"type": "other", "function": {"name": "get_weather"}}}, "tool_choice",
            "function"),
           ({"tools": [{"type": "function"}], "tool_choice": "required"}, "tools", "tools[0].function.name")]
    for extra, param, word in bad:
        for stream in (False, True):
            status, e = error_of(*post("scripted", "/v1/chat/completions", dict({"messages": QUESTION}, **extra),
                                       stream=stream))
            assert status == 400 and e["param"] == param and word in e["message"], (extra, status, e)


@case
def forced_tokens_carry_no_logprobs():
    body = {"messages": QUESTION, "tools": [WEATHER], "tool_choice": "required", "temperature": 0,
            "logprobs": True, "top_logprobs": 1, "chat_template_kwargs": {"enable_thinking": False}}
    out = chat("scripted", body)
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"] == scripted_checkpoint.REQUIRED_TOKENS, content
    assert content[0]["token"] == "get" and content[0]["bytes"] == list(b"get"), content[0]
    _, _, streamed = joined(chat_stream("scripted", body))
    assert streamed == content, (streamed, content)
    # With thinking the inserted opening has no entries either: the reasoning's tokens, then the model's call.
    body["chat_template_kwargs"] = {"enable_thinking": True}
    out = chat("scripted", body)
    thinking = out["choices"][0]["logprobs"]["content"]
    assert len(thinking) == out["usage"]["completion_tokens"] == THOUGHT_TOKENS + len(content), thinking
    assert [t["token"] for t in thinking] == ["<think>", "ok", "</think>"] + [t["token"] for t in content], thinking
    _, _, streamed = joined(chat_stream("scripted", body))
    assert streamed == thinking, (streamed, thinking)


def logprob_request(**extra):
    return dict({"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 6, "temperature": 0,
                 "ignore_eos": True}, **extra)


@case
def chat_logprobs_are_the_engines():
    body = logprob_request(logprobs=True, top_logprobs=3)
    out = chat("tiny", body)
    content = out["choices"][0]["logprobs"]["content"]
    assert out["choices"][0]["logprobs"]["refusal"] is None, out["choices"][0]["logprobs"]
    assert len(content) == out["usage"]["completion_tokens"] == 6, out
    # The same prompt ids through /v1/completions: the same tokens, logprobs and alternatives.
    status, data = post("tiny", "/v1/completions", {"prompt": rendered_ids(body), "max_tokens": 6, "temperature": 0,
                                                    "ignore_eos": True, "logprobs": 3})
    assert status == 200, data
    reference = json.loads(data)["choices"][0]
    assert [c["token"] for c in content] == reference["logprobs"]["tokens"], (content, reference)
    assert [c["logprob"] for c in content] == reference["logprobs"]["token_logprobs"], (content, reference)
    for entry, top in zip(content, reference["logprobs"]["top_logprobs"]):
        assert len(entry["top_logprobs"]) == 3, entry
        assert {t["token"]: t["logprob"] for t in entry["top_logprobs"]} == top, (entry, top)
        logprobs = [t["logprob"] for t in entry["top_logprobs"]]
        assert logprobs == sorted(logprobs, reverse=True) and logprobs[0] == entry["logprob"], entry  # greedy
        for t in entry["top_logprobs"]:
            assert isinstance(t["bytes"], list) and all(0 <= b < 256 for b in t["bytes"]), t
    # Each token's own bytes: together they are the answer's text (the template's tags included).
    text = bytes(b for entry in content for b in entry["bytes"]).decode()
    assert text == reference["text"], (text, reference["text"])
    # Streamed: every token's entry once, in order, across the chunks.
    _, _, streamed = joined(chat_stream("tiny", body))
    assert streamed == content, (streamed, content)


@case
def logprobs_fields_are_checked():
    out = chat("tiny", logprob_request(logprobs=True))
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == 6 and all(entry["top_logprobs"] == [] for entry in content), content
    assert chat("tiny", logprob_request())["choices"][0]["logprobs"] is None
    assert chat("tiny", logprob_request(logprobs=False))["choices"][0]["logprobs"] is None
    _, _, streamed = joined(chat_stream("tiny", logprob_request()))
    assert streamed is None, streamed
    bad = [({"logprobs": 1}, "logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
           ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"), ({"top_logprobs": 2}, "top_logprobs"),
           ({"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
           ({"logprobs": True, "top_logprobs": 1.5}, "top_logprobs")]
    for extra, param in bad:
        status, e = error_of(*post("tiny", "/v1/chat/completions", logprob_request(**extra)))
        assert status == 400 and e["param"] == param and param in e["message"], (extra, status, e)


@case
def a_client_that_leaves_a_stream_with_logprobs_is_cancelled():
    """The stream's logprobs held for the next chunk go with the request: the server answers the next request,
    and at the end every KV block is back (KiteServer.stop checks it; LeakSanitizer the memory, under ASan)."""
    body = json.dumps(logprob_request(max_tokens=3000, logprobs=True, top_logprobs=5, stream=True)).encode()
    s = socket.create_connection(("127.0.0.1", servers["tiny"].port), timeout=30)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    received = b""
    while received.count(b"top_logprobs") < 8:
        piece = s.recv(65536)
        assert piece, received[-200:]
        received += piece
    s.close()
    assert chat("tiny", logprob_request(logprobs=True))["usage"]["completion_tokens"] == 6


for server in servers.values():
    try:
        server.stop()
    except AssertionError as e:
        print("FAIL the server did not stop cleanly: %s" % e)
        sys.exit(1)
folder.cleanup()
finish()

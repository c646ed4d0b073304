#!/usr/bin/env python3
"""`kite serve` on the tiny checkpoint (CPU backend), over loopback only: OpenAI-style completions and chat
completions, streamed and not, concurrent requests against their solo results (continuous batching on the CPU is exact),
stop strings, errors in OpenAI's shape, HTTP on evhttp (keep-alive, pipelining, chunked bodies, limits, query strings,
IPv6), clients that hang up (streamed or not: cancelled, every KV block back), the access log, --api-key,
--cors-origin, --max-queue, and SIGTERM's drain."""
import argparse, http.client, json, os, signal, socket, subprocess, sys, tempfile, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("--kite", required=True)
ap.add_argument("--data", required=True)
args = ap.parse_args()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from cases import case, finish  # noqa: E402
from kite_server import KiteServer  # noqa: E402

def Server(*extra, host="127.0.0.1", env=None):
    """One `kite serve` on the tiny checkpoint (tests/common/kite_server.py)."""
    return KiteServer(args.kite, os.path.join(args.data, "tiny"), *extra, host=host, env=env)


try:
    main_server = Server()
except RuntimeError as e:
    print(e)
    print("0 passed, 1 failed")
    sys.exit(1)
server = main_server.process
PORT = main_server.port


def request(method, path, body=None, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    c.request(method, path, body=json.dumps(body) if isinstance(body, dict) else body,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def complete(body):
    status, data = request("POST", "/v1/completions", body)
    assert status == 200, (status, data)
    return json.loads(data)


def wait_for(predicate, seconds, what):
    """Polls predicate until it holds: a case waits for the state it needs, not for a fixed time."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def stream(body):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    c.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)))
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream"
    events = [e[len("data: "):] for e in r.read().decode().split("\n\n") if e.startswith("data: ")]
    c.close()
    return events


def kite_run_text(prompt, n):
    p = subprocess.run([args.kite, "run", "--model", os.path.join(args.data, "tiny"), "--prompt", prompt, "-n", str(n),
                        "--ignore-eos", "--json", "--backend", "cpu"], capture_output=True, timeout=120)
    return json.loads(p.stdout.decode().strip().split("\n")[-1])["text"]


@case
def health_and_models():
    assert request("GET", "/health") == (200, b'{"status":"ok"}')
    status, data = request("GET", "/v1/models")
    assert status == 200 and json.loads(data)["data"][0]["id"] == "tiny"


@case
def completion_equals_kite_run():
    out = complete({"prompt": "The capital of France is", "max_tokens": 12, "ignore_eos": True})
    choice = out["choices"][0]
    assert choice["text"] == kite_run_text("The capital of France is", 12), choice
    assert choice["finish_reason"] == "length"
    assert out["usage"] == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17}, out["usage"]


@case
def stream_concatenates_to_the_completion():
    body = {"prompt": "Hello", "max_tokens": 10, "ignore_eos": True}
    whole = complete(body)["choices"][0]["text"]
    events = stream(body)
    assert events[-1] == "[DONE]", events[-1]
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


@case
def concurrent_requests_get_their_solo_results():
    ref = json.load(open(os.path.join(args.data, "tiny.reference.json")))
    bodies = [{"prompt": r["prompt_ids"], "max_tokens": 16, "ignore_eos": True} for r in ref["results"]]
    bodies += [{"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0.8, "seed": 42, "ignore_eos": True}]
    solo = [complete(b)["choices"][0]["text"] for b in bodies]
    results = [None] * len(bodies)

    def worker(i):
        results[i] = complete(bodies[i])["choices"][0]["text"]
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == solo, (results, solo)


@case
def stop_string_ends_the_completion():
    whole = complete({"prompt": "Hello", "max_tokens": 24, "ignore_eos": True})["choices"][0]["text"]
    stop = whole[len(whole) // 2: len(whole) // 2 + 2]
    out = complete({"prompt": "Hello", "max_tokens": 24, "ignore_eos": True, "stop": [stop]})["choices"][0]
    assert out["finish_reason"] == "stop" and out["text"] == whole[: whole.index(stop)], (out, stop)


@case
def bad_requests_get_clear_errors():
    for body, code in [("{not json", 400), ({"max_tokens": 3}, 400), ({"prompt": "x", "temperature": -1}, 400),
                       ({"prompt": [999999999]}, 400), ({"prompt": "x", "stop": 5}, 400),
                       ({"prompt": "x", "n": 17}, 400)]:
        status, data = request("POST", "/v1/completions", body)
        assert status == code, (body, status, data)
        assert json.loads(data)["error"]["message"], data
    assert request("GET", "/v1/completions")[0] == 405
    assert request("GET", "/nowhere")[0] == 404


@case
def every_field_is_checked():
    bad = [("5", "JSON object"), ("[1]", "JSON object"), ("", "not JSON"), ('{"prompt":"\\ud800"}', "not JSON"),
           ({"prompt": []}, "prompt"), ({"prompt": ""}, "empty"), ({"prompt": [1.5]}, "prompt[0]"),
           ({"prompt": [1, -1]}, "prompt[1]"), ({"prompt": {"text": "x"}}, "prompt"),
           ({"prompt": [1], "max_tokens": "3"}, "max_tokens"), ({"prompt": [1], "temperature": True}, "temperature"),
           ({"prompt": [1], "top_p": 1.5}, "top_p"), ({"prompt": [1], "top_k": -2}, "top_k"),
           ({"prompt": [1], "min_p": -0.1}, "min_p"), ({"prompt": [1], "repetition_penalty": 0}, "repetition_penalty"),
           ({"prompt": [1], "seed": -1}, "seed"), ({"prompt": [1], "logprobs": 21}, "logprobs"),
           ({"prompt": [1], "stop": ["a", 3]}, "stop"), ({"prompt": [1], "stop": list("abcdefghi")}, "stop"),
           ({"prompt": [1], "stream": 1}, "stream"), ({"prompt": [1], "ignore_eos": "yes"}, "ignore_eos"),
           ({"prompt": [1], "echo": True, "logprobs": 2}, "'echo' with 'logprobs'"),
           ({"prompt": [1], "echo": 1}, "echo"), ({"prompt": [1], "suffix": "x"}, "suffix"),
           ({"prompt": [1], "best_of": 2}, "best_of"), ({"prompt": [1], "n": 2, "best_of": 1}, "best_of"),
           ({"prompt": [1], "logprobs": 0}, "logprobs"), ({"prompt": [1], "n": 0}, "'n'"),
           ({"prompt": [1], "n": 2.5}, "'n'"), ({"prompt": [1], "max_tokens": 0}, "max_tokens"),
           ({"prompt": [1], "presence_penalty": 2.5}, "presence_penalty"),
           ({"prompt": [1], "frequency_penalty": -3}, "frequency_penalty"),
           ({"prompt": [1], "min_tokens": -1}, "min_tokens"), ({"prompt": [1], "logit_bias": [1]}, "logit_bias"),
           ({"prompt": [1], "logit_bias": {"x": 1}}, "logit_bias"),
           ({"prompt": [1], "logit_bias": {"5": 101}}, "logit_bias"),
           ({"prompt": [1], "logit_bias": {"999999999": 1}}, "logit_bias")]
    for body, word in bad:
        status, data = request("POST", "/v1/completions", body)
        assert status == 400, (body, status, data)
        message = json.loads(data)["error"]["message"]
        assert word in message, (body, message)
    # Unknown fields are ignored and null means absent, as OpenAI-compatible servers do.
    out = complete({"prompt": [1, 2], "max_tokens": 2, "user": "x", "echo": False, "stop": None, "stream": None,
                    "temperature": None, "suffix": None, "best_of": 1, "logprobs": None, "metadata": {"nested": [1]}})
    assert out["usage"]["completion_tokens"] == 2, out
    # logit_bias (token 15 is "0"), the penalties and min_tokens reach the sampler.
    out = complete({"prompt": [1, 2], "max_tokens": 3, "logit_bias": {"15": 100}, "ignore_eos": True})
    assert out["choices"][0]["text"] == "000", out
    out = complete({"prompt": [1, 2], "max_tokens": 3, "presence_penalty": 1.5, "frequency_penalty": 0.5,
                    "min_tokens": 3})
    assert out["usage"]["completion_tokens"] == 3, out
    # logprobs in OpenAI's completions shape: the chosen token is the greedy one, so its logprob is the best of its
    # top; the tokens spell the text; text_offset counts the characters before each token.
    out = complete({"prompt": "The capital of France is", "max_tokens": 4, "logprobs": 3, "ignore_eos": True})
    choice = out["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 4, lp
    assert "".join(lp["tokens"]) == choice["text"], (lp, choice["text"])
    offset = 0
    for token, value, top, at in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], lp["text_offset"]):
        assert at == offset and len(top) <= 3 and value <= 0, lp
        assert token in top and abs(top[token] - value) < 1e-6 and value >= max(top.values()) - 1e-6, lp
        offset += len(token)
    # A key given twice is refused on every endpoint, naming it.
    for path, body in (("/v1/completions", '{"prompt": [1], "max_tokens": 2, "max_tokens": 3}'),
                       ("/tokenize", '{"prompt": "a", "prompt": "b"}')):
        status, data = request("POST", path, body)
        assert status == 400 and "duplicate" in json.loads(data)["error"]["message"], (path, status, data)
    # A NUL inside the prompt text is text like any other.
    out = complete({"prompt": "a\u0000b", "max_tokens": 1})
    assert out["usage"]["prompt_tokens"] == 3, out


def chat(body, stream_it=False):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    c.request("POST", "/v1/chat/completions", body=json.dumps(dict(body, stream=True) if stream_it else body))
    r = c.getresponse()
    data = r.read()
    c.close()
    assert r.status == 200, (r.status, data)
    if not stream_it:
        return json.loads(data)
    assert r.getheader("Content-Type") == "text/event-stream"
    return [e[len("data: "):] for e in data.decode().split("\n\n") if e.startswith("data: ")]


@case
def chat_completions_render_the_template_and_parse_the_answer():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    body = {"messages": messages, "max_tokens": 6, "seed": 4, "temperature": 0.7}
    whole = chat(body)
    choice = whole["choices"][0]
    assert whole["object"] == "chat.completion" and choice["message"]["role"] == "assistant", whole
    assert choice["finish_reason"] in ("length", "stop") and whole["usage"]["completion_tokens"] <= 6, whole
    # the prompt is the template's: its token count equals kite template's ids
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(body, f)
        f.flush()
        rendered = subprocess.run([args.kite, "template", "--model", os.path.join(args.data, "tiny"), "--request",
                                   f.name, "--json"], capture_output=True, timeout=60)
    assert whole["usage"]["prompt_tokens"] == len(json.loads(rendered.stdout)["ids"]), (whole, rendered.stderr)
    # streamed: role first, the deltas concatenate to the whole answer, finish last, then [DONE]
    events = chat(body, stream_it=True)
    assert events[-1] == "[DONE]", events
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("usage" not in c for c in chunks), chunks  # usage only when stream_options asks
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant", chunks[0]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    thought = "".join(c["choices"][0]["delta"].get("reasoning_content", "") for c in chunks)
    assert text == choice["message"]["content"], (text, choice)
    assert thought == choice["message"].get("reasoning_content", ""), (thought, choice)
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"], chunks[-1]
    # stream_options.include_usage: one more chunk, with empty choices and the usage
    events = chat(dict(body, stream_options={"include_usage": True}), stream_it=True)
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"], chunks[-1]
    assert chunks[-2]["choices"][0]["finish_reason"] == choice["finish_reason"], chunks[-2]
    assert all(c["usage"] is None for c in chunks[:-1]), chunks
    # tools and thinking off are the template's business; the answer is parsed either way
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    out = chat({"messages": messages, "tools": [weather], "max_tokens": 4,
                "chat_template_kwargs": {"enable_thinking": False}})
    assert out["choices"][0]["message"]["role"] == "assistant", out


@case
def chat_requests_are_checked():
    bad = [({"messages": []}, "messages"), ({"max_tokens": 2}, "messages"),
           ({"messages": [{"content": "x"}]}, "role"),
           ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "tool_choice"),
           ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
           ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "max_completion_tokens": 2}, "both"),
           ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, "temperature"),
           ("[1]", "JSON object")]
    for body, word in bad:
        status, data = request("POST", "/v1/chat/completions", body)
        assert status == 400, (body, status, data)
        message = json.loads(data)["error"]["message"]
        assert word in message, (body, message)
    assert request("GET", "/v1/chat/completions")[0] == 405
    out = chat({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 2, "logprobs": False})
    assert out["usage"]["completion_tokens"] <= 2, out


@case
def a_client_that_hangs_up_mid_stream_is_cancelled():
    s = socket.create_connection(("127.0.0.1", PORT), timeout=30)
    body = json.dumps({"prompt": "Hello", "max_tokens": 3000, "stream": True, "ignore_eos": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    s.recv(4096)
    s.close()
    # 3000 tokens would keep it running for seconds: it is gone only once the server has cancelled it
    wait_for(lambda: main_server.metric("kite_requests_running") == 0, 30, "the cancellation of the stream")
    out = complete({"prompt": "Hello", "max_tokens": 4, "ignore_eos": True})  # the server still serves
    assert out["choices"][0]["finish_reason"] == "length"


def error_of(status, data, expected_status):
    """The body is OpenAI's error shape, with the status as its code."""
    assert status == expected_status, (status, data)
    error = json.loads(data)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == expected_status, error
    assert error["message"], error
    return error


@case
def errors_have_openais_shape():
    e = error_of(*request("POST", "/v1/completions", {"prompt": [1], "top_p": 2}), 400)
    assert e["param"] == "top_p" and e["type"] == "invalid_request_error", e
    e = error_of(*request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                            "stream_options": {"include_usage": True}}), 400)
    assert e["param"] == "stream_options", e
    # refused by the library at submission: 400 with its message, streamed or not (the stream has not begun)
    for stream_it in (False, True):
        e = error_of(*request("POST", "/v1/completions", {"prompt": [999999999], "stream": stream_it}), 400)
        assert "999999999" in e["message"] or "vocab" in e["message"], e
    error_of(*request("GET", "/nowhere"), 404)
    error_of(*request("GET", "/v1/completions"), 405)
    error_of(*request("POST", "/v1/models"), 405)
    # a model this server does not serve is 404 naming "model", as vLLM answers; the served one's name is fine
    for path, body in (("/v1/completions", {"model": "other", "prompt": "x", "max_tokens": 1}),
                       ("/v1/chat/completions", {"model": "other", "messages": [{"role": "user", "content": "x"}]})):
        e = error_of(*request("POST", path, body), 404)
        assert e["param"] == "model" and "other" in e["message"], e
        e = error_of(*request("POST", path, dict(body, model=5)), 400)
        assert e["param"] == "model", e
    assert complete({"model": "tiny", "prompt": "x", "max_tokens": 1})["usage"]["completion_tokens"] == 1


@case
def models_by_id():
    status, data = request("GET", "/v1/models/tiny")
    assert status == 200 and json.loads(data) == {"id": "tiny", "object": "model", "owned_by": "kite"}, data
    e = error_of(*request("GET", "/v1/models/other"), 404)
    assert "other" in e["message"] and e["param"] == "model", e


@case
def query_strings_do_not_change_the_route():
    assert request("GET", "/health?probe=1") == (200, b'{"status":"ok"}')
    status, data = request("GET", "/v1/models?x=1&y")
    assert status == 200 and json.loads(data)["data"][0]["id"] == "tiny", data
    out = json.loads(request("POST", "/v1/completions?debug=1", {"prompt": [1, 2], "max_tokens": 2})[1])
    assert out["usage"]["completion_tokens"] == 2, out


@case
def keep_alive_serves_two_requests_on_one_connection():
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": "Hello", "max_tokens": 3, "ignore_eos": True}))
    first = c.getresponse()
    a = json.loads(first.read())
    sock = c.sock
    assert sock is not None and first.getheader("Connection", "").lower() != "close", first.getheaders()
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": "Hello", "max_tokens": 3, "ignore_eos": True}))
    b = json.loads(c.getresponse().read())
    assert c.sock is sock, "the second request opened a new connection"
    assert a["choices"][0]["text"] == b["choices"][0]["text"], (a, b)
    # a stream on the same connection, then one more request
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": "Hello", "max_tokens": 3, "ignore_eos": True,
                                                          "stream": True}))
    events = c.getresponse().read().decode()
    assert events.rstrip().endswith("data: [DONE]"), events
    c.request("GET", "/health")
    assert c.getresponse().read() == b'{"status":"ok"}' and c.sock is sock
    c.close()


def read_responses(sock, n):
    """n HTTP/1.1 responses with Content-Length bodies, read off one socket in the order they come."""
    data, out = b"", []
    while len(out) < n:
        while b"\r\n\r\n" not in data:
            more = sock.recv(65536)
            assert more, ("the connection closed after %d responses" % len(out), data)
            data += more
        head, data = data.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
        length = int(headers["content-length"])
        while len(data) < length:
            more = sock.recv(65536)
            assert more, "the connection closed inside a body"
            data += more
        out.append((int(lines[0].split()[1]), data[:length]))
        data = data[length:]
    return out


@case
def pipelined_requests_are_answered_in_order():
    bodies = [json.dumps({"prompt": p, "max_tokens": 4, "ignore_eos": True}).encode() for p in ("Hello", "Once")]
    wire = b"".join(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(b) + b for b in bodies)
    wire += b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    s = socket.create_connection(("127.0.0.1", PORT), timeout=120)
    s.sendall(wire)  # three requests before reading any answer
    answers = read_responses(s, 3)
    s.close()
    solo = [complete({"prompt": p, "max_tokens": 4, "ignore_eos": True})["choices"][0]["text"] for p in ("Hello", "Once")]
    assert [a[0] for a in answers] == [200, 200, 200], answers
    assert [json.loads(a[1])["choices"][0]["text"] for a in answers[:2]] == solo, (answers, solo)
    assert answers[2][1] == b'{"status":"ok"}', answers[2]


@case
def a_chunked_request_body_is_read():
    body = json.dumps({"prompt": "Hello", "max_tokens": 3, "ignore_eos": True}).encode()
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    c.request("POST", "/v1/completions", body=iter([body[:7], body[7:20], body[20:]]), encode_chunked=True,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    assert r.status == 200, (r.status, data)
    assert json.loads(data)["choices"][0]["text"] == complete(json.loads(body))["choices"][0]["text"]


@case
def header_and_body_limits():
    s = socket.create_connection(("127.0.0.1", PORT), timeout=60)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (32 << 10) + b"\r\n\r\n")
    status = s.recv(4096).split(b"\r\n", 1)[0]
    s.close()
    # libevent 2.1's evhttp answers an oversized header itself, with 400, before the server sees the request
    assert status == b"HTTP/1.1 400 Bad Request", status
    s = socket.create_connection(("127.0.0.1", PORT), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{" % (17 << 20))
    status = s.recv(4096).split(b"\r\n", 1)[0]
    s.close()
    assert status.startswith(b"HTTP/1.1 413"), status
    assert request("GET", "/health")[0] == 200  # the server still serves


@case
def include_usage_on_completions():
    body = {"prompt": "Hello", "max_tokens": 5, "ignore_eos": True}
    plain = stream(body)
    assert all("usage" not in json.loads(e) for e in plain[:-1]), plain
    events = stream(dict(body, stream_options={"include_usage": True}))
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and chunks[-1]["choices"] == [], events
    assert chunks[-1]["usage"] == {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6}, chunks[-1]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-2]["usage"] is None, chunks[-2]
    e = error_of(*request("POST", "/v1/completions", dict(body, stream_options={"include_usage": True})), 400)
    assert e["param"] == "stream_options", e
    e = error_of(*request("POST", "/v1/completions", dict(body, stream=True, stream_options={"x": 1})), 400)
    assert "stream_options.x" in e["message"], e


@case
def a_client_that_hangs_up_before_the_answer_is_cancelled():
    s = socket.create_connection(("127.0.0.1", PORT), timeout=30)
    body = json.dumps({"prompt": "Hangup", "max_tokens": 4000, "ignore_eos": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    wait_for(lambda: main_server.metric("kite_requests_running") == 1, 30, "the request to run")
    s.close()  # not streamed: nothing was written to it, the server notices the hangup itself

    def cancelled():
        return any(e["status"] == 499 and e["finish_reason"] == "cancelled" and e["prompt_tokens"] == 2
                   for e in main_server.access_log())
    wait_for(cancelled, 30, "the cancelled request in the access log")
    entry = [e for e in main_server.access_log() if e["status"] == 499][-1]
    assert entry["generated_tokens"] < 4000 and entry["endpoint"] == "/v1/completions", entry
    out = complete({"prompt": "Hello", "max_tokens": 2, "ignore_eos": True})  # the server still serves
    assert out["choices"][0]["finish_reason"] == "length"


@case
def the_access_log_has_a_line_per_request():
    # The lines are found by what they log, not by how many came: the server writes a line once the response is
    # sent, and a line of an earlier case's request (a cancelled stream ends after its client has gone) may come
    # among these two.
    before = len(main_server.access_log())
    out = complete({"prompt": "Hello", "max_tokens": 3, "ignore_eos": True})
    request("GET", "/v1/models")

    def ours():
        lines = main_server.access_log()[before:]
        done = [i for i, e in enumerate(lines) if e["id"] == out["id"]]
        models = [e for e in lines[done[0] + 1:] if e["endpoint"] == "/v1/models"] if done else []
        return (lines[done[0]], models[0]) if models else None
    wait_for(ours, 10, "the two requests' access log lines")
    done, models = ours()
    assert done["endpoint"] == "/v1/completions" and done["status"] == 200, done
    assert done["generated_tokens"] == 3 and done["prompt_tokens"] == 1, done
    assert done["finish_reason"] == "length", done
    assert done["ttft_ms"] is not None and done["total_ms"] >= done["ttft_ms"] >= 0, done
    assert models["status"] == 200 and models["id"] is None and models["finish_reason"] is None, models


@case
def a_stalled_client_delays_no_one():
    # a stream whose client never reads, and a client that sends half a header and stops
    stalled = socket.create_connection(("127.0.0.1", PORT), timeout=30)
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    body = json.dumps({"prompt": "Stall", "max_tokens": 4000, "stream": True, "ignore_eos": True}).encode()
    stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    slow = socket.create_connection(("127.0.0.1", PORT), timeout=30)
    slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
    started = time.time()
    out = complete({"prompt": "Hello", "max_tokens": 4, "ignore_eos": True})
    assert out["usage"]["completion_tokens"] == 4 and time.time() - started < 60, out
    assert request("GET", "/health") == (200, b'{"status":"ok"}')
    stalled.close()
    slow.close()


@case
def tokenize_and_detokenize():
    status, data = request("POST", "/tokenize", {"model": "tiny", "prompt": "The capital of France is"})
    out = json.loads(data)
    assert status == 200 and out["count"] == 5 == len(out["tokens"]) and out["max_model_len"] == 4096, out
    assert out["token_strs"] is None, out
    reference = subprocess.run([args.kite, "tokenize", "--model", os.path.join(args.data, "tiny"), "--json",
                                "The capital of France is"], capture_output=True, timeout=60)
    assert json.loads(reference.stdout)["ids"] == out["tokens"], (out, reference.stdout)  # `kite tokenize`'s ids
    status, data = request("POST", "/detokenize", {"tokens": out["tokens"]})
    assert status == 200 and json.loads(data) == {"prompt": "The capital of France is"}, data
    messages = [{"role": "user", "content": "Hello!"}]
    status, data = request("POST", "/tokenize", {"messages": messages})
    chat_ids = json.loads(data)["tokens"]
    assert status == 200 and len(chat_ids) == chat({"messages": messages, "max_tokens": 1})["usage"]["prompt_tokens"]
    for path, body, param in [("/tokenize", {"prompt": 5}, "prompt"), ("/tokenize", {}, "prompt"),
                              ("/tokenize", {"prompt": "x", "extra": 1}, "extra"),
                              ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, "add_special_tokens"),
                              ("/detokenize", {"tokens": [1, -1]}, "tokens"), ("/detokenize", {"tokens": "x"}, "tokens"),
                              ("/detokenize", {"tokens": [999999999]}, "tokens")]:
        e = error_of(*request("POST", path, body), 400)
        assert e["param"] == param, (path, body, e)
    error_of(*request("POST", "/tokenize", {"model": "other", "prompt": "x"}), 404)
    error_of(*request("GET", "/tokenize"), 405)


@case
def a_prompt_past_the_context_is_refused():
    # the library refuses it at submission, naming its length and the limit (4,096 for tiny); the server says 400
    for endpoint, body in [("/v1/completions", {"prompt": [1] * 5000, "max_tokens": 2}),
                           ("/v1/completions", {"prompt": [1] * 5000, "max_tokens": 2, "stream": True})]:
        e = error_of(*request("POST", endpoint, body), 400)
        assert "5000" in e["message"] and "4096" in e["message"], e
    assert request("GET", "/health") == (200, b'{"status":"ok"}')


@case
def metrics_in_prometheus_format():
    complete({"prompt": [1, 2, 3], "max_tokens": 3, "ignore_eos": True})
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    c.request("GET", "/metrics")
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/plain"), (r.status, text)
    values = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name, value = line.rsplit(" ", 1)
        values[name] = float(value)
        assert name.startswith("kite_"), line
    assert values['kite_requests_total{endpoint="/v1/completions",status="200"}'] >= 1, text
    assert values['kite_generation_tokens_total'] >= 3 and values['kite_prompt_tokens_total'] >= 3, text
    for h in ("kite_time_to_first_token_seconds", "kite_e2e_request_latency_seconds", "kite_time_per_output_token_seconds"):
        assert values[h + '_bucket{le="+Inf"}'] == values[h + "_count"] >= 1, (h, text)
    # idle: every KV block is free, nothing runs or waits
    assert values["kite_kv_blocks_used"] == 0 and values["kite_kv_blocks_free"] > 0, text
    assert values["kite_requests_running"] == 0 and values["kite_requests_waiting"] == 0, text
    assert "kite_preemptions_total" in values, text


@case
def stops_on_sigterm():
    main_server.stop()


def request_at(srv, method, path, body=None, headers=None, host="127.0.0.1"):
    c = http.client.HTTPConnection(host, srv.port, timeout=120)
    c.request(method, path, body=json.dumps(body) if isinstance(body, dict) else body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data, r


@case
def api_key_is_required_on_the_api():
    for srv in (Server("--api-key", "s3cret"), Server(env={"KITE_API_KEY": "s3cret"})):
        try:
            status, data, _ = request_at(srv, "GET", "/v1/models")
            e = error_of(status, data, 401)
            assert e["type"] == "authentication_error", e
            error_of(*request_at(srv, "GET", "/v1/models", headers={"Authorization": "Bearer wrong"})[:2], 401)
            error_of(*request_at(srv, "GET", "/v1/models", headers={"Authorization": "Bearer s3cre"})[:2], 401)
            error_of(*request_at(srv, "POST", "/v1/completions", {"prompt": [1]})[:2], 401)
            status, data, _ = request_at(srv, "GET", "/v1/models", headers={"Authorization": "Bearer s3cret"})
            assert status == 200 and json.loads(data)["data"][0]["id"] == "tiny", data
            status, data, _ = request_at(srv, "POST", "/v1/completions", {"prompt": [1], "max_tokens": 1},
                                         headers={"Authorization": "Bearer s3cret"})
            assert status == 200, data
            assert request_at(srv, "GET", "/health")[0] == 200  # health needs no key
            srv.stop()
        finally:
            srv.kill()


@case
def cors_preflight_and_origin():
    srv = Server("--cors-origin", "https://app.example")
    try:
        status, data, r = request_at(srv, "OPTIONS", "/v1/chat/completions",
                                     headers={"Origin": "https://app.example",
                                              "Access-Control-Request-Method": "POST",
                                              "Access-Control-Request-Headers": "authorization, content-type"})
        assert status == 204, (status, data)
        assert r.getheader("Access-Control-Allow-Origin") == "https://app.example", r.getheaders()
        assert "POST" in r.getheader("Access-Control-Allow-Methods"), r.getheaders()
        assert "Authorization" in r.getheader("Access-Control-Allow-Headers"), r.getheaders()
        status, data, r = request_at(srv, "GET", "/v1/models", headers={"Origin": "https://app.example"})
        assert status == 200 and r.getheader("Access-Control-Allow-Origin") == "https://app.example"
        srv.stop()
    finally:
        srv.kill()


@case
def max_queue_answers_503_with_retry_after():
    srv = Server("--max-batch", "1", "--max-queue", "1")
    held = []
    try:
        for prompt in ("One", "Two"):  # one runs, one waits
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
            body = json.dumps({"prompt": prompt, "max_tokens": 4000, "ignore_eos": True, "stream": True}).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            held.append(s)
        wait_for(lambda: srv.metric("kite_requests_running") == 1 and srv.metric("kite_requests_waiting") == 1, 30,
                 "one request running and one waiting")
        status, data, r = request_at(srv, "POST", "/v1/completions", {"prompt": "Three", "max_tokens": 1})
        error_of(status, data, 503)
        assert r.getheader("Retry-After") == "1", r.getheaders()
        for s in held:
            s.close()
        # the two hung up: their places come back
        wait_for(lambda: len([e for e in srv.access_log() if e["status"] == 499]) == 2, 30, "two cancellations")
        status, data, _ = request_at(srv, "POST", "/v1/completions", {"prompt": "Four", "max_tokens": 1})
        assert status == 200, data
        srv.stop()
    finally:
        for s in held:
            s.close()
        srv.kill()


@case
def max_connections_refuses_one_more():
    srv = Server("--max-connections", "2")
    held = []
    try:
        for _ in range(2):
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
            c.request("GET", "/health")
            assert c.getresponse().read() == b'{"status":"ok"}'
            held.append(c)  # kept open (keep-alive)
        status, data, r = request_at(srv, "GET", "/v1/models")
        error_of(status, data, 503)
        assert r.getheader("Connection", "").lower() == "close", r.getheaders()
        held.pop().close()
        wait_for(lambda: request_at(srv, "GET", "/v1/models")[0] == 200, 10, "a free connection")
        srv.stop()
    finally:
        for c in held:
            c.close()
        srv.kill()


@case
def sigterm_drains_then_cancels():
    srv = Server("--drain-timeout", "1")
    try:
        results = {}

        def ask(name, body):
            results[name] = request_at(srv, "POST", "/v1/completions", body)[:2]
        short = threading.Thread(target=ask, args=("short", {"prompt": "Hello", "max_tokens": 6, "ignore_eos": True}))
        long = threading.Thread(target=ask, args=("long", {"prompt": "Hello", "max_tokens": 4000, "ignore_eos": True}))
        def ask_stream():
            status, data = request_at(srv, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 4000,
                                                                       "ignore_eos": True, "stream": True})[:2]
            results["stream"] = status, data
        streamed = threading.Thread(target=ask_stream)
        short.start()
        long.start()
        streamed.start()
        # all three admitted (the short one may be done already) before the signal
        wait_for(lambda: srv.metric("kite_requests_running") + ("short" in results) == 3, 30, "three requests")
        srv.process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        try:  # no new connections once stopping
            socket.create_connection(("127.0.0.1", srv.port), timeout=5).close()
            refused = False
        except OSError:
            refused = True
        short.join(60)
        long.join(60)
        streamed.join(60)
        code = srv.process.wait(30)
        srv.reader.join(10)
        assert code == 0, (code, srv.lines[-10:])
        assert refused, "the listening socket stayed open while draining"
        status, data = results["short"]
        assert status == 200 and json.loads(data)["usage"]["completion_tokens"] == 6, (status, data)
        error_of(*results["long"], 503)  # cancelled at the drain's deadline
        status, data = results["stream"]  # a stream that had begun: the error is its last event
        events = [e[len("data: "):] for e in data.decode().split("\n\n") if e.startswith("data: ")]
        assert status == 200 and events[-1] == "[DONE]", (status, events[-3:])
        assert json.loads(events[-2])["error"]["code"] == 503, events[-2]
        assert any("drain timed out" in l for l in srv.lines), srv.lines[-10:]
        stopped = [l for l in srv.lines if l.startswith("kite serve: stopped; KV blocks free ")]
        free, total = stopped[-1].split("free ")[1].split(" of ")
        assert int(free) == int(total), stopped
    finally:
        srv.kill()


@case
def bad_options_are_usage_errors():
    tiny = os.path.join(args.data, "tiny")
    for extra, word in [(["--cors-origin", "a\nb"], "cors-origin"), (["--cors-origin", ""], "cors-origin"),
                        (["--api-key", ""], "api-key"), (["--max-queue", "-1"], "max-queue"),
                        (["--drain-timeout", "x"], "drain-timeout"), (["--host", "no.such.host.invalid"], "host")]:
        p = subprocess.run([args.kite, "serve", "--model", tiny, "--port", "0", *extra], capture_output=True,
                           timeout=60, text=True)
        assert p.returncode in (1, 2) and word in p.stderr, (extra, p.returncode, p.stderr)
        assert p.returncode == 2 or word == "host", (extra, p.returncode)


@case
def ipv6_loopback():
    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        probe.bind(("::1", 0))
        probe.close()
    except OSError as e:
        print("SKIP ipv6_loopback: this machine has no ::1 (%s)" % e)
        return
    srv = Server(host="::1")
    try:
        status, data, _ = request_at(srv, "POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 3,
                                                                     "ignore_eos": True}, host="::1")
        assert status == 200, data
        srv.stop()
    finally:
        srv.kill()
    srv = Server(host="localhost")  # a host name resolves
    try:
        assert request_at(srv, "GET", "/health", host=srv.host)[0] == 200
        srv.stop()
    finally:
        srv.kill()


@case
def a_request_whose_logits_are_not_finite_fails_alone():
    """tiny-untied with a +inf in the embedding row of token 9707 (tests/common/poisoned_checkpoint.py): a prompt
    holding it has NaN logits. Not streamed: 500 in OpenAI's error shape naming them; streamed: an error event, then
    [DONE]; chat too. A healthy request running beside them gets what it gets alone; the access log says
    finish_reason "error"; every KV block comes back."""
    import poisoned_checkpoint
    folder = poisoned_checkpoint.make(os.path.join(args.data, "tiny-untied"))
    srv = KiteServer(args.kite, folder)
    try:
        poisoned = {"prompt": [poisoned_checkpoint.POISONED_TOKEN, 11, 1879], "max_tokens": 6, "ignore_eos": True}
        healthy = {"prompt": [1879, 374, 264, 1273], "max_tokens": 24, "ignore_eos": True}
        status, data, _ = request_at(srv, "POST", "/v1/completions", healthy)
        assert status == 200, data
        alone = json.loads(data)["choices"][0]
        results = {}

        def run(name, path, body):
            results[name] = request_at(srv, "POST", path, body)[:2]
        threads = [threading.Thread(target=run, args=a) for a in (
            ("healthy", "/v1/completions", healthy), ("whole", "/v1/completions", poisoned),
            ("stream", "/v1/completions", dict(poisoned, stream=True)),
            ("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        status, data = results["healthy"]
        assert status == 200 and json.loads(data)["choices"][0] == alone, (status, data, alone)
        for name in ("whole", "chat"):
            status, data = results[name]
            error = json.loads(data)["error"]
            assert status == 500 and error["type"] == "server_error" and error["code"] == 500, (name, status, data)
            assert "NaN" in error["message"] and "logits" in error["message"], error
        status, data = results["stream"]
        events = [e[len("data: "):] for e in data.decode().split("\n\n") if e.startswith("data: ")]
        assert status == 200 and events[-1] == "[DONE]", (status, events)
        error = json.loads(events[-2])["error"]
        assert error["code"] == 500 and "NaN" in error["message"], events
        wait_for(lambda: len([e for e in srv.access_log() if e["finish_reason"] == "error"]) >= 3, 10,
                 "three access log lines with finish_reason error")
        assert all(e["status"] == 500 for e in srv.access_log() if e["finish_reason"] == "error"), srv.access_log()
        srv.stop()
    finally:
        srv.kill()
        poisoned_checkpoint.remove(folder)


main_server.kill()
finish()

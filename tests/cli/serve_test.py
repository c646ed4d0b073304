#!/usr/bin/env python3
"""`kite serve` on the tiny checkpoint (CPU backend), over loopback only: OpenAI-style completions and chat
completions, streamed and not, concurrent requests against their solo results (continuous batching on the CPU is exact),
stop strings, errors, a client that hangs up mid-stream, and a clean stop on SIGTERM."""
import argparse, http.client, json, os, signal, socket, subprocess, sys, tempfile, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("--kite", required=True)
ap.add_argument("--data", required=True)
args = ap.parse_args()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from cases import case, finish  # noqa: E402

server = subprocess.Popen([args.kite, "serve", "--model", os.path.join(args.data, "tiny"), "--port", "0",
                           "--backend", "cpu", "--threads", "2", "--max-step-tokens", "64"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
line = server.stdout.readline()  # "listening on 127.0.0.1:PORT", printed once the model is loaded
if not line.startswith("listening on "):
    server.kill()
    print("server did not start:", line, server.stderr.read())
    print("0 passed, 1 failed")
    sys.exit(1)
PORT = int(line.strip().rsplit(":", 1)[1])


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
                       ({"prompt": [999999999]}, 400), ({"prompt": "x", "stop": 5}, 400), ({"prompt": "x", "n": 2}, 400)]:
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
           ({"prompt": [1], "stream": 1}, "stream"), ({"prompt": [1], "ignore_eos": "yes"}, "ignore_eos")]
    for body, word in bad:
        status, data = request("POST", "/v1/completions", body)
        assert status == 400, (body, status, data)
        message = json.loads(data)["error"]["message"]
        assert word in message, (body, message)
    # Unknown fields are ignored and null means absent, as OpenAI-compatible servers do.
    out = complete({"prompt": [1, 2], "max_tokens": 2, "user": "x", "echo": False, "stop": None, "stream": None,
                    "temperature": None, "suffix": {"nested": [1]}})
    assert out["usage"]["completion_tokens"] == 2, out
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
    # streamed: role first, the deltas concatenate to the whole answer, finish and usage last, then [DONE]
    events = chat(body, stream_it=True)
    assert events[-1] == "[DONE]", events
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant", chunks[0]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    thought = "".join(c["choices"][0]["delta"].get("reasoning_content", "") for c in chunks)
    assert text == choice["message"]["content"], (text, choice)
    assert thought == choice["message"].get("reasoning_content", ""), (thought, choice)
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"] and "usage" in chunks[-1]
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
           ({"messages": [{"role": "user", "content": "x"}], "logprobs": True}, "logprobs"),
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
    time.sleep(0.5)
    out = complete({"prompt": "Hello", "max_tokens": 4, "ignore_eos": True})  # the server still serves
    assert out["choices"][0]["finish_reason"] == "length"


@case
def stops_on_sigterm():
    server.send_signal(signal.SIGTERM)
    try:
        code = server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
        raise AssertionError("the server did not stop within 30 s")
    assert code == 0, (code, server.stderr.read())


if server.poll() is None:
    server.kill()
finish()

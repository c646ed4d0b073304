#!/usr/bin/env python3
"""`kite serve` on the tiny checkpoint (CPU backend, loopback only): the completion fields that shape the choices.
`n` (choices indexed in order; with a seed, choice i is the request of seed + i; greedy choices are identical;
streamed chunks carry their index; usage counts every choice; a client that leaves cancels all of them; admission
counts n; the prefix cache shares the prompt's blocks; choices held for their lead's prompt count as waiting), `echo` (the prompt before each choice's text, streamed in
the first chunk; with max_tokens 0 the prompt alone; with logprobs refused), and streamed `logprobs` (the chunks'
concatenate to the whole response's). The CPU backend is exact, so solo and batched requests agree token for token."""
import argparse, http.client, json, os, re, socket, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("--kite", required=True)
ap.add_argument("--data", required=True)
args = ap.parse_args()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from cases import case, finish  # noqa: E402
from kite_server import KiteServer  # noqa: E402

try:
    # --max-batch 4 and --max-queue 4: up to 8 engine requests in flight, so n = 9 can never be admitted.
    server = KiteServer(args.kite, os.path.join(args.data, "tiny"), "--max-batch", "4", "--max-queue", "4")
except RuntimeError as e:
    print(e)
    print("0 passed, 1 failed")
    sys.exit(1)
PORT = server.port


def request(method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    c.request(method, path, body=json.dumps(body) if isinstance(body, dict) else body,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def post(body, path="/v1/completions"):
    status, data = request("POST", path, body)
    assert status == 200, (status, data)
    return json.loads(data)


def stream(body, path="/v1/completions"):
    """The chunks of a streamed request (the [DONE] checked and dropped)."""
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    c.request("POST", path, body=json.dumps(dict(body, stream=True)))
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream", (r.status, data)
    events = [e[len("data: "):] for e in data.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]", events
    return [json.loads(e) for e in events[:-1]]


def by_choice(chunks, n):
    """Each choice's chunks, in order; every chunk carries exactly one choice."""
    out = [[] for _ in range(n)]
    for c in chunks:
        if not c["choices"]:
            continue  # include_usage's last chunk
        assert len(c["choices"]) == 1, c
        out[c["choices"][0]["index"]].append(c["choices"][0])
    return out


def metric(name):
    status, data = request("GET", "/metrics")
    assert status == 200
    m = re.search(r"^%s(?:\{\})? (\S+)$" % re.escape(name), data.decode(), re.M)
    assert m, (name, data[:2000])
    return float(m.group(1))


def metrics_sum(*names):
    """The sum of unlabelled series read from one answer of /metrics."""
    status, data = request("GET", "/metrics")
    assert status == 200
    total = 0.0
    for name in names:
        m = re.search(r"^%s(?:\{\})? (\S+)$" % re.escape(name), data.decode(), re.M)
        assert m, (name, data[:2000])
        total += float(m.group(1))
    return total


SAMPLED = {"prompt": "Once upon a time", "max_tokens": 10, "temperature": 1.0, "ignore_eos": True}


@case
def n_with_a_seed_gives_choice_i_the_seed_plus_i():
    out = post(dict(SAMPLED, n=3, seed=7))
    choices = out["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2], out
    solo = [post(dict(SAMPLED, seed=7 + i))["choices"][0]["text"] for i in range(3)]
    assert [c["text"] for c in choices] == solo, (choices, solo)
    assert len(set(solo)) > 1, solo  # the choices differ
    assert post(dict(SAMPLED, n=3, seed=7))["choices"] == choices  # and are reproducible
    assert out["usage"] == {"prompt_tokens": 4, "completion_tokens": 30, "total_tokens": 34}, out["usage"]
    # streamed: each chunk carries its choice's index; each choice's chunks concatenate to its text
    chunks = stream(dict(SAMPLED, n=3, seed=7, stream_options={"include_usage": True}))
    per = by_choice(chunks, 3)
    assert ["".join(p["text"] for p in part) for part in per] == solo, per
    for part in per:
        assert part[-1]["finish_reason"] == "length" and all(p["finish_reason"] is None for p in part[:-1]), part
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == out["usage"], chunks[-1]


@case
def n_without_a_seed_gives_different_choices():
    out = post(dict(SAMPLED, n=4))
    texts = [c["text"] for c in out["choices"]]
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3] and len(set(texts)) > 1, out
    per = by_choice(stream(dict(SAMPLED, n=4)), 4)
    streamed = ["".join(p["text"] for p in part) for part in per]
    assert len(set(streamed)) > 1 and all(streamed), streamed


@case
def greedy_choices_are_identical():
    body = {"prompt": "The capital of France is", "max_tokens": 8, "ignore_eos": True}
    one = post(body)["choices"][0]["text"]
    out = post(dict(body, n=3))
    assert [c["text"] for c in out["choices"]] == [one] * 3, out
    assert out["usage"]["completion_tokens"] == 24, out


@case
def echo_puts_the_prompt_before_each_choice():
    body = {"prompt": "Hello there", "max_tokens": 6, "ignore_eos": True}
    plain = post(body)["choices"][0]["text"]
    out = post(dict(body, echo=True, n=2))
    assert [c["text"] for c in out["choices"]] == ["Hello there" + plain] * 2, out
    assert out["usage"]["completion_tokens"] == 12, out
    # streamed: the first chunk of each choice carries the prompt
    per = by_choice(stream(dict(body, echo=True, n=2)), 2)
    for part in per:
        assert part[0]["text"].startswith("Hello there"), part
        assert "".join(p["text"] for p in part) == "Hello there" + plain, part
    # a prompt of token ids echoes as its text
    ids = json.loads(request("POST", "/tokenize", {"prompt": "Hello there"})[1])["tokens"]
    out = post({"prompt": ids, "max_tokens": 6, "ignore_eos": True, "echo": True})
    assert out["choices"][0]["text"] == "Hello there" + plain, out


@case
def echo_with_max_tokens_zero_is_the_prompt_alone():
    out = post({"prompt": "Hello there", "max_tokens": 0, "echo": True, "n": 2})
    assert [(c["index"], c["text"], c["finish_reason"]) for c in out["choices"]] == \
        [(0, "Hello there", "length"), (1, "Hello there", "length")], out
    assert out["usage"] == {"prompt_tokens": 2, "completion_tokens": 0, "total_tokens": 2}, out
    chunks = stream({"prompt": "Hello there", "max_tokens": 0, "echo": True, "stream_options": {"include_usage": True}})
    assert [c["choices"] for c in chunks[:-1]] == \
        [[{"index": 0, "text": "Hello there", "logprobs": None, "finish_reason": "length"}]], chunks
    assert chunks[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 0, "total_tokens": 2}, chunks[-1]
    # without echo, max_tokens 0 asks for nothing the engine can give; min_tokens cannot be more than it
    status, data = request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 0})
    assert status == 400 and json.loads(data)["error"]["param"] == "max_tokens", data
    status, data = request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 0, "echo": True, "min_tokens": 2})
    assert status == 400 and json.loads(data)["error"]["param"] == "min_tokens", data


@case
def echo_with_logprobs_is_refused():
    for stream_it in (False, True):
        status, data = request("POST", "/v1/completions", {"prompt": "x", "echo": True, "logprobs": 2,
                                                          "stream": stream_it})
        error = json.loads(data)["error"]
        assert status == 400 and error["param"] == "echo", (status, data)
        assert "'echo' with 'logprobs' is not implemented" in error["message"], error


@case
def streamed_logprobs_concatenate_to_the_whole_ones():
    body = dict(SAMPLED, max_tokens=16, seed=11, logprobs=3, n=2)
    whole = post(body)["choices"]
    per = by_choice(stream(body), 2)
    for choice, part in zip(whole, per):
        joined = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for p in part:
            lp = p["logprobs"]
            assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == \
                len(lp["text_offset"]), lp
            for k in joined:
                joined[k] += lp[k]
        assert joined == choice["logprobs"], (joined, choice["logprobs"])
        assert len(joined["tokens"]) == 16 and "".join(p["text"] for p in part) == choice["text"], part


@case
def a_stream_sends_chunks_for_tokens_without_text():
    # Token 151900 is past the tokenizer's ids (the embedding's padding), so it has no text; random weights pick
    # such ids. The stream still sends a chunk as tokens arrive (as vLLM's), not one chunk at the end: clients time
    # the first token and the gaps between tokens by chunks. 32 steps of the CPU backend cannot all land in one
    # delivery of the loop thread.
    chunks = stream({"prompt": [1, 2], "max_tokens": 32, "ignore_eos": True, "logit_bias": {"151900": 100}})
    assert len(chunks) >= 2, chunks
    assert all(len(c["choices"]) == 1 and c["choices"][0]["text"] == "" for c in chunks), chunks
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length", chunks


@case
def chat_completions_take_n():
    body = {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 6, "temperature": 1.0,
            "seed": 3, "n": 2}
    out = post(body, "/v1/chat/completions")
    assert [c["index"] for c in out["choices"]] == [0, 1], out
    second = post(dict(body, n=1, seed=4), "/v1/chat/completions")["choices"][0]
    assert out["choices"][1]["message"] == second["message"], (out, second)
    generated = sum(post(dict(body, n=1, seed=3 + i), "/v1/chat/completions")["usage"]["completion_tokens"]
                    for i in range(2))
    assert out["usage"]["completion_tokens"] == generated, out
    chunks = stream(body, "/v1/chat/completions")
    indices = {c["choices"][0]["index"] for c in chunks}
    assert indices == {0, 1}, chunks
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"][0]["index"] == 1)
    assert content == (second["message"]["content"] or ""), (content, second)


@case
def n_is_checked_and_counted_by_admission():
    for n in (0, 17, "2"):
        status, data = request("POST", "/v1/completions", {"prompt": "x", "n": n})
        assert status == 400 and json.loads(data)["error"]["param"] == "n", (n, status, data)
    # 9 engine requests can never be in flight at once here (4 running, 4 waiting): 400, not a 503 to retry
    status, data = request("POST", "/v1/completions", {"prompt": "x", "n": 9, "max_tokens": 1})
    assert status == 400 and json.loads(data)["error"]["param"] == "n", (status, data)
    assert len(post({"prompt": "x", "n": 8, "max_tokens": 1})["choices"]) == 8
    # 5 choices running and waiting: 4 more do not fit, 3 do (they wait behind the 5 until those end)
    def send(body):
        s = socket.create_connection(("127.0.0.1", PORT), timeout=30)
        data = json.dumps(body).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
        return s
    long = send({"prompt": "Hello", "max_tokens": 3000, "stream": True, "ignore_eos": True, "n": 5})
    long.recv(4096)  # the stream began
    status, data = request("POST", "/v1/completions", {"prompt": "x", "n": 4, "max_tokens": 1})
    assert status == 503 and json.loads(data)["error"]["code"] == 503, (status, data)
    three = send({"prompt": "x", "n": 3, "max_tokens": 1})
    # admitted, not refused, before the client leaves: all 8 choices run or wait (one reading of /metrics)
    deadline = time.time() + 20
    while True:
        in_flight = metrics_sum("kite_requests_running", "kite_requests_waiting")
        if in_flight == 8 or time.time() > deadline:
            break
        time.sleep(0.02)
    assert in_flight == 8, in_flight
    long.close()  # the client leaves: all 5 choices are cancelled, and the 3 run
    answer = b""
    while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
        more = three.recv(65536)
        assert more, answer
        answer += more
    three.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert len(json.loads(answer.split(b"\r\n\r\n", 1)[1])["choices"]) == 3, answer
    deadline = time.time() + 20
    while time.time() < deadline and (metric("kite_requests_running") or metric("kite_requests_waiting")):
        time.sleep(0.05)
    assert metric("kite_requests_running") == 0 and metric("kite_requests_waiting") == 0
    assert metric("kite_kv_blocks_used") == 0


@case
def a_client_that_leaves_before_the_whole_answer_cancels_every_choice():
    # An earlier case's hangup may still be logging (its line comes once the loop has taken its last events), so
    # this case counts only requests that arrive after a marker request: ids number requests in arrival order.
    marker = int(post({"prompt": "Hello", "max_tokens": 1})["id"].rsplit("-", 1)[1])

    def hangups():
        return [e for e in server.access_log()
                if e["status"] == 499 and int(e["id"].rsplit("-", 1)[1]) > marker]
    earlier = len(hangups())
    s = socket.create_connection(("127.0.0.1", PORT), timeout=30)
    body = json.dumps({"prompt": "Hello", "max_tokens": 3000, "ignore_eos": True, "n": 3}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    deadline = time.time() + 20
    while time.time() < deadline and metric("kite_requests_running") < 3:
        time.sleep(0.02)
    assert metric("kite_requests_running") == 3
    s.close()
    while time.time() < deadline and metric("kite_requests_running"):
        time.sleep(0.02)
    assert metric("kite_requests_running") == 0 and metric("kite_kv_blocks_used") == 0
    while time.time() < deadline and len(hangups()) == earlier:
        time.sleep(0.02)  # the access log line comes once the loop has taken the cancelled choices' last events
    log = hangups()[earlier:]
    assert len(log) == 1 and log[0]["generated_tokens"] < 3 * 3000, log


@case
def the_choices_share_the_prompts_cached_blocks():
    # a prompt of three full 128-token blocks and some, new to the cache: choices 1..3 take its blocks from it
    words = " ".join("word%d" % i for i in range(400))
    n_prompt = json.loads(request("POST", "/tokenize", {"prompt": words})[1])["count"]
    assert n_prompt > 3 * 128, n_prompt
    before = metric("kite_prefix_cache_hits_total")
    out = post({"prompt": words, "max_tokens": 2, "n": 4, "temperature": 1.0, "seed": 1, "ignore_eos": True})
    hits = metric("kite_prefix_cache_hits_total") - before
    blocks = (n_prompt - 1) // 128
    assert hits == 3 * blocks * 128, (hits, n_prompt)
    solo = [post({"prompt": words, "max_tokens": 2, "temperature": 1.0, "seed": 1 + i, "ignore_eos": True})
            for i in range(4)]
    assert [c["text"] for c in out["choices"]] == [s["choices"][0]["text"] for s in solo], (out, solo)


@case
def held_choices_count_as_waiting():
    # 4 choices fill the batch; a request of n = 3 with a prompt past one block waits: its lead in the engine's
    # queue, choices 1 and 2 held by the server until the lead's prompt is computed. /metrics counts all three.
    def send(body):
        s = socket.create_connection(("127.0.0.1", PORT), timeout=30)
        data = json.dumps(body).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
        return s
    long = send({"prompt": "Hello", "max_tokens": 3000, "stream": True, "ignore_eos": True, "n": 4})
    long.recv(4096)  # the stream began
    words = " ".join("held%d" % i for i in range(200))
    three = send({"prompt": words, "max_tokens": 1, "n": 3})
    deadline = time.time() + 30  # a hang guard: the three are admitted at once, the batch stays full
    seen = None
    while time.time() < deadline:
        seen = (metric("kite_requests_running"), metric("kite_requests_waiting"))
        if seen == (4, 3):
            break
        time.sleep(0.02)
    long.close()
    answer = b""
    while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
        more = three.recv(65536)
        assert more, answer
        answer += more
    three.close()
    assert seen == (4, 3), "running, waiting: %s, not (4, 3)" % (seen,)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert len(json.loads(answer.split(b"\r\n\r\n", 1)[1])["choices"]) == 3, answer
    deadline = time.time() + 20
    while time.time() < deadline and (metric("kite_requests_running") or metric("kite_requests_waiting")):
        time.sleep(0.05)
    assert metric("kite_requests_running") == 0 and metric("kite_requests_waiting") == 0


@case
def stops_cleanly():
    server.stop()  # every KV block back


finish()

#!/usr/bin/env python3
"""`kite serve` under faults and load (issue 37, item 8): tiny-vocab1k (the tiny checkpoint with a 1,024-id
vocabulary: what is checked is kite against itself, and a token costs little) on the CPU backend, loopback only,
bounded in count (thousands of requests, a fixed number per client) and seeded, so a failure repeats.

Each round: concurrent clients mix streamed and non-streamed /v1/completions and /v1/chat/completions (prompts as
text and as token ids, stream_options.include_usage, keep-alive, pipelined requests), malformed JSON and bad
fields, oversize bodies, clients that trickle their request a few bytes at a time, clients that hang up at random
points (before the body is complete, mid-stream, while their request waits in the queue or runs: each one a
cancellation), and clients that send half a header and stall; then a burst of requests past --max-queue; then the
queue is filled on purpose, so that every further request must be 503. Checked:
  - the server never crashes or hangs: every request gets an answer or a closed socket within ANSWER_SECONDS,
    and a stalled header is closed after --timeout;
  - every well-formed greedy request is answered 200 with exactly `kite run`'s text for its prompt and length
    (the references come from `kite run` once, before the load); only in the burst may one be 503 instead, and
    past the filled queue each must be, always with Retry-After; no other 5xx, in the answers or the access log;
  - once idle, /metrics says every KV block is free and nothing runs or waits, after each round;
  - the server's RSS, a second after each round (idle: it gives what glibc's arenas keep back then), is within
    RSS_BOUND_BYTES of its baseline (a second after one request of each kind, before the load), and after the
    last round within RSS_GROWTH_BYTES of what it was after the first: a leak or a buffer kept per request grows it
    round after round; under AddressSanitizer, whose quarantine holds freed memory, one round runs and
    LeakSanitizer judges leaks at exit;
  - SIGTERM stops it with exit code 0 and every KV block free.
On a failure it prints what went wrong (the first failures, each with its client and action) and the server's
log."""
import argparse, http.client, json, os, random, socket, subprocess, sys, tempfile, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("--kite", required=True)
ap.add_argument("--data", required=True)
ap.add_argument("--seed", type=int, default=37)
ap.add_argument("--clients", type=int, default=8, help="concurrent client threads")
ap.add_argument("--actions", type=int, default=110, help="actions per client per round")
ap.add_argument("--rounds", type=int, default=2)
args = ap.parse_args()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from kite_server import KiteServer  # noqa: E402

MODEL_NAME = "tiny-vocab1k"  # the served model's name: its directory's
MODEL = os.path.join(args.data, MODEL_NAME)
MAX_BATCH, MAX_QUEUE, TIMEOUT = 4, 16, 3  # the server's --max-batch, --max-queue and --timeout
ANSWER_SECONDS = 60  # a request's answer (or the server closing the socket) comes within this, or it hangs
# RSS a second after the load, the arenas trimmed (tools/serve/generation.c): what stays above the baseline is
# the pages the load touched that keep a live chunk (the KV pool's, the tokenizer's per-thread piece cache, the
# engine's per-step buffers grown to their peak) and glibc's fragments; measured 9-27 MiB after two rounds of this
# test and up to 39 MiB after four; untrimmed, one burst left 170-300 MiB.
RSS_BOUND_BYTES = 48 << 20
RSS_GROWTH_BYTES = 32 << 20
IDLE_SECONDS = 1.0  # the server trims its arenas once idle for a moment (tools/serve/generation.c)
BODY_LIMIT = 16 << 20  # the server's fixed body limit (docs/serve.md)
TEXT_PROMPTS = ["Hello", "The capital of France is", "Once upon a time", "def fibonacci(n):", "日本語のテキスト",
                "a b c d e f g h"]
LENGTHS = (1, 5, 17)
CHATS = [[{"role": "user", "content": "Hello!"}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]]
CHAT_LENGTH = 12

failures = []
failures_lock = threading.Lock()
counts = {}


def fail(what, detail):
    with failures_lock:
        failures.append("%s: %s" % (what, detail))


def count(what):
    with failures_lock:
        counts[what] = counts.get(what, 0) + 1


# ---- references from `kite run`, once ----

def kite_json(*cli):
    p = subprocess.run([args.kite, *cli], capture_output=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError("kite %s failed: %s" % (" ".join(cli), p.stderr.decode(errors="replace")))
    return [json.loads(line) for line in p.stdout.decode().splitlines() if line.startswith("{")]


def make_references():
    """(prompt text) -> {length: text}, the prompts' token ids, and the chats' {index: text}."""
    with tempfile.TemporaryDirectory() as folder:
        prompt_file = os.path.join(folder, "prompts.txt")
        with open(prompt_file, "w") as f:
            f.write("".join(p + "\n" for p in TEXT_PROMPTS))
        text, ids = {p: {} for p in TEXT_PROMPTS}, {}
        for n in LENGTHS:
            out = kite_json("run", "--model", MODEL, "--prompt-file", prompt_file, "-n", str(n), "--ignore-eos",
                            "--json", "--backend", "cpu", "--threads", "2")
            assert len(out) == len(TEXT_PROMPTS), out
            for p, o in zip(TEXT_PROMPTS, out):
                assert o["finish_reason"] == "length" and len(o["tokens"]) == n, o
                text[p][n] = o["text"]
                ids[p] = o["prompt_tokens"]
        chat = {}
        for i, messages in enumerate(CHATS):
            request_file = os.path.join(folder, "chat%d.json" % i)
            with open(request_file, "w") as f:
                json.dump({"messages": messages}, f)
            prompt_ids = kite_json("template", "--model", MODEL, "--request", request_file, "--json")[-1]["ids"]
            o = kite_json("run", "--model", MODEL, "--prompt-ids", ",".join(map(str, prompt_ids)), "-n",
                          str(CHAT_LENGTH), "--ignore-eos", "--json", "--backend", "cpu", "--threads", "2")[-1]
            # the chat answer is all content only if the model wrote no tag the parser splits at
            assert "<think>" not in o["text"] and "<tool_call>" not in o["text"], o
            chat[i] = o["text"]
    return text, ids, chat


REF_TEXT, REF_IDS, REF_CHAT = make_references()

# ---- HTTP on raw sockets, for what http.client cannot do (pipelining, hanging up at chosen points) ----


class Reader:
    """HTTP/1.1 responses read off one socket, with Content-Length or chunked bodies."""

    def __init__(self, sock):
        self.sock, self.data = sock, b""

    def _more(self):
        more = self.sock.recv(65536)
        if not more:
            raise ConnectionError("closed by the server")
        self.data += more

    def line(self):
        while b"\r\n" not in self.data:
            self._more()
        line, self.data = self.data.split(b"\r\n", 1)
        return line

    def exactly(self, n):
        while len(self.data) < n:
            self._more()
        out, self.data = self.data[:n], self.data[n:]
        return out

    def head(self):
        status = int(self.line().split()[1])
        headers = {}
        while True:
            line = self.line()
            if not line:
                return status, headers
            k, v = line.decode("latin-1").split(":", 1)
            headers[k.strip().lower()] = v.strip()

    def chunks(self, headers):
        """The body's pieces as they come."""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int(self.line().split(b";")[0], 16)
                piece = self.exactly(size)
                self.line()
                if size == 0:
                    return
                yield piece
        else:
            yield self.exactly(int(headers.get("content-length", "0")))

    def response(self):
        status, headers = self.head()
        return status, headers, b"".join(self.chunks(headers))


def connect(port):
    return socket.create_connection(("127.0.0.1", port), timeout=ANSWER_SECONDS)


def wire(method, path, body=b"", extra=b""):
    return (b"%s %s HTTP/1.1\r\nHost: loadtest\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
            % (method.encode(), path.encode(), len(body), extra)) + body


def sse_events(body):
    return [e[len("data: "):] for e in body.decode().split("\n\n") if e.startswith("data: ")]


# ---- what one client does ----


class Client:
    def __init__(self, port, rng, name):
        self.port, self.rng, self.name = port, rng, name
        self.connection, self.last_used = None, 0.0

    # requests and what their answers must be

    def generation(self, allow_busy=False):
        """A well-formed greedy request: (path, body, check(status, headers, data) -> None)."""
        rng = self.rng
        stream = rng.random() < 0.5
        if rng.random() < 0.3:
            chat_index = rng.randrange(len(CHATS))
            body = {"messages": CHATS[chat_index], "max_tokens": CHAT_LENGTH, "temperature": 0, "ignore_eos": True}
            expected, n, path = REF_CHAT[chat_index], CHAT_LENGTH, "/v1/chat/completions"
        else:
            prompt = rng.choice(TEXT_PROMPTS)
            n = rng.choice(LENGTHS)
            body = {"prompt": REF_IDS[prompt] if rng.random() < 0.3 else prompt, "max_tokens": n, "temperature": 0,
                    "ignore_eos": True}
            expected, path = REF_TEXT[prompt][n], "/v1/completions"
        if rng.random() < 0.5:
            body["model"] = MODEL_NAME  # as OpenAI's clients send it
        usage = stream and rng.random() < 0.5
        if stream:
            body["stream"] = True
            if usage:
                body["stream_options"] = {"include_usage": True}
        chat = path.endswith("chat/completions")

        def check(status, headers, data):
            if status == 503 and allow_busy:
                if headers.get("retry-after") != "1":
                    raise AssertionError("503 without Retry-After: 1 (%s)" % headers)
                count("503 busy")
                return
            if status != 200:
                raise AssertionError("status %d: %r" % (status, data[:300]))
            if not stream:
                out = json.loads(data)
                choice = out["choices"][0]
                got = choice["message"]["content"] if chat else choice["text"]
                if chat and choice["message"].get("reasoning_content") or chat and choice["message"].get("tool_calls"):
                    raise AssertionError("unexpected reasoning or tool calls: %s" % choice)
                if out["usage"]["completion_tokens"] != n:
                    raise AssertionError("usage %s, %d tokens asked" % (out["usage"], n))
            else:
                events = sse_events(data)
                if not events or events[-1] != "[DONE]":
                    raise AssertionError("the stream does not end with [DONE]: %r" % events[-3:])
                chunks = [json.loads(e) for e in events[:-1]]
                if usage:
                    last = chunks.pop()
                    if last["choices"] != [] or last["usage"]["completion_tokens"] != n:
                        raise AssertionError("the usage chunk: %s" % last)
                if any("error" in c for c in chunks):
                    raise AssertionError("an error event: %s" % chunks)
                pieces = [c["choices"][0]["delta"].get("content") or "" for c in chunks] if chat else \
                         [c["choices"][0]["text"] for c in chunks]
                got = "".join(pieces)
                choice = chunks[-1]["choices"][0]
            if got != expected:
                raise AssertionError("text %r, kite run's %r" % (got, expected))
            if choice["finish_reason"] != "length":
                raise AssertionError("finish_reason %r" % choice["finish_reason"])
            count("200 checked")

        return path, json.dumps(body, ensure_ascii=False).encode(), check

    def keep_alive_request(self, method, path, body):
        """One request on this client's keep-alive connection (a new one after it idled: the server closes an
        idle connection after --timeout)."""
        if self.connection is None or time.time() - self.last_used > TIMEOUT / 3:
            if self.connection:
                self.connection.close()
            self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=ANSWER_SECONDS)
        c = self.connection
        try:
            c.request(method, path, body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
        except Exception:
            c.close()
            self.connection = None
            raise
        self.last_used = time.time()
        if (r.getheader("Connection") or "").lower() == "close":
            c.close()
            self.connection = None
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data

    def do_generation(self):
        path, body, check = self.generation()
        check(*self.keep_alive_request("POST", path, body))

    def do_malformed(self):
        rng = self.rng
        path = rng.choice(["/v1/completions", "/v1/chat/completions", "/tokenize"])
        good = json.dumps({"prompt": "Hello", "max_tokens": 3} if path != "/v1/chat/completions" else
                          {"messages": CHATS[0], "max_tokens": 3}).encode()
        kind = rng.randrange(7)
        if kind == 0:
            body = good[:rng.randrange(1, len(good) - 1)]  # cut short
        elif kind == 1:
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))  # noise
        elif kind == 2:
            body = b'{"prompt": "\xff\xfe", "max_tokens": 3}'  # invalid UTF-8
        elif kind == 3:
            body = b"[" * rng.randrange(100, 5000) + b"]" * 3  # deep, unbalanced
        elif kind == 4:
            body = b'{"prompt": "a", "max_tokens": 3, "max_tokens": 4}'  # a duplicate key
        elif kind == 5:
            body = json.dumps({"prompt": "x", "max_tokens": rng.choice(["3", -1, 1.5, None, []]),
                               "temperature": rng.choice([-1, "hot", 101])}).encode()  # bad fields
        else:
            body = json.dumps({"prompt": [rng.choice([-5, 10 ** 12, 1.5, "x"])], "max_tokens": 2}).encode()
        status, _, data = self.keep_alive_request("POST", path, body)
        if status != 400:
            raise AssertionError("%s %r: status %d %r" % (path, body[:80], status, data[:200]))
        error = json.loads(data)["error"]
        if error["code"] != 400 or not error["message"]:
            raise AssertionError("error shape: %s" % error)
        count("400 malformed")

    def do_oversize(self):
        """A body over the limit: evhttp answers 413 (or closes the socket) without reading it all."""
        s = connect(self.port)
        try:
            if self.rng.random() < 0.5:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (BODY_LIMIT + 1)
                          + b"{" * self.rng.randrange(0, 65536))
            else:  # chunked: the size is known only as it grows
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                          + b"%x\r\n" % (BODY_LIMIT + 1) + b"{" * 1024)
            try:
                status, _, _ = Reader(s).response()
            except ConnectionError:
                count("oversize: closed")
                return
            if status != 413:
                raise AssertionError("oversize body: status %d" % status)
            count("413 oversize")
        finally:
            s.close()

    def do_hangup_before_body(self):
        path, body, _ = self.generation()
        s = connect(self.port)
        data = wire("POST", path, body)
        s.sendall(data[:self.rng.randrange(1, len(data))])
        s.close()
        count("hangup before the body")

    def do_hangup_mid_stream(self):
        long = json.dumps({"prompt": self.rng.choice(TEXT_PROMPTS), "max_tokens": 2000, "ignore_eos": True,
                           "stream": True}).encode()
        s = connect(self.port)
        try:
            s.sendall(wire("POST", "/v1/completions", long))
            reader = Reader(s)
            status, headers = reader.head()
            if status == 503 and headers.get("retry-after") == "1":
                count("503 busy")
                return
            if status != 200:
                raise AssertionError("status %d" % status)
            want = self.rng.randrange(1, 6)
            for i, _ in enumerate(reader.chunks(headers)):
                if i + 1 >= want:
                    break
        finally:
            s.close()
        count("hangup mid-stream")

    def do_hangup_waiting(self):
        """A request not streamed, so nothing comes back before its end: the client leaves while it waits in
        the queue or runs."""
        path, body, _ = self.generation()
        body = json.loads(body)
        body.pop("stream", None), body.pop("stream_options", None)
        body["max_tokens"] = 2000
        s = connect(self.port)
        s.sendall(wire("POST", path, json.dumps(body).encode()))
        time.sleep(self.rng.random() * 0.05)
        s.close()
        count("hangup while waiting")

    def do_trickle(self):
        """A slow client: the request a few bytes at a time; the answer is still exact."""
        path, body, check = self.generation()
        data = wire("POST", path, body)
        s = connect(self.port)
        try:
            at = 0
            while at < len(data):
                step = self.rng.randrange(1, 24)
                s.sendall(data[at:at + step])
                at += step
                time.sleep(self.rng.random() * 0.004)
            check(*Reader(s).response())
        finally:
            s.close()
        count("trickled")

    def do_pipelined(self):
        requests = [self.generation() for _ in range(self.rng.randrange(2, 5))]
        data = b"".join(wire("POST", path, body) for path, body, _ in requests) + wire("GET", "/health")
        s = connect(self.port)
        try:
            s.sendall(data)
            reader = Reader(s)
            for _, _, check in requests:
                check(*reader.response())
            status, _, body = reader.response()
            if (status, body) != (200, b'{"status":"ok"}'):
                raise AssertionError("/health after the pipelined ones: %d %r" % (status, body))
        finally:
            s.close()
        count("pipelined")

    def do_small(self):
        path, expected = self.rng.choice([("/health", 200), ("/v1/models", 200), ("/v1/models/" + MODEL_NAME, 200),
                                          ("/metrics", 200), ("/nowhere", 404), ("/v1/models/other", 404),
                                          ("/v1/completions", 405)])
        status, _, data = self.keep_alive_request("GET", path, None)
        if status != expected:
            raise AssertionError("GET %s: %d %r" % (path, status, data[:200]))

    ACTIONS = [(do_generation, 40), (do_pipelined, 8), (do_trickle, 4), (do_malformed, 12), (do_oversize, 2),
               (do_hangup_before_body, 6), (do_hangup_mid_stream, 6), (do_hangup_waiting, 6), (do_small, 8)]

    def run(self, n):
        functions = [f for f, _ in self.ACTIONS]
        weights = [w for _, w in self.ACTIONS]
        for i in range(n):
            action = self.rng.choices(functions, weights)[0]
            try:
                action(self)
            except Exception as e:  # noqa: BLE001 -- every failure is reported with its action
                fail("%s #%d %s" % (self.name, i, action.__name__), "%s: %s" % (type(e).__name__, e))
        if self.connection:
            self.connection.close()


# ---- the server's state ----


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=ANSWER_SECONDS)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def wait_until_idle(port, what):
    """Every request done and every KV block free (a cancelled request frees its blocks in the next step)."""
    deadline = time.time() + 30
    while True:
        m = metrics(port)
        if m["kite_kv_blocks_used"] == 0 and m["kite_requests_running"] == 0 and m["kite_requests_waiting"] == 0:
            return m
        if time.time() > deadline:
            fail(what, "not idle 30 s after the load: %s" % {k: v for k, v in m.items() if "kv" in k or "requests_r"
                                                               in k or "waiting" in k})
            return m
        time.sleep(0.05)


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS for %d" % pid)


def under_address_sanitizer(pid):
    with open("/proc/%d/maps" % pid) as f:
        return "libasan" in f.read()


def stalled_headers(port, n):
    """Clients that send part of a header and stop: the server closes each after --timeout, and meanwhile
    serves everyone else. Returns the sockets, checked by check_stalled_closed."""
    out = []
    for i in range(n):
        s = connect(port)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le"[:10 + i % 30])
        out.append(s)
    return out


def check_stalled_closed(sockets):
    for s in sockets:
        s.settimeout(TIMEOUT + ANSWER_SECONDS)
        try:
            while s.recv(65536):
                pass  # evhttp may answer 400/408 before it closes
        except OSError as e:
            fail("stalled header", "not closed by the server within --timeout: %s" % e)
        finally:
            s.close()
    count("stalled header closed")


def burst(port, seed, n):
    """n requests at once, past --max-batch + --max-queue: each is exact or 503 with Retry-After."""
    def one(i):
        client = Client(port, random.Random(seed * 7919 + i), "burst%d" % i)
        path, body, check = client.generation(allow_busy=True)
        try:
            s = connect(port)
            try:
                s.sendall(wire("POST", path, body))
                check(*Reader(s).response())
            finally:
                s.close()
        except Exception as e:  # noqa: BLE001
            fail("burst #%d" % i, "%s: %s" % (type(e).__name__, e))
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def fill_the_queue(port, seed):
    """--max-batch running and --max-queue waiting: every further request is 503 with Retry-After; the ones
    that waited hang up (cancelled in the queue), the running ones too, and the server serves again."""
    holders = []
    for i in range(MAX_BATCH + MAX_QUEUE):
        s = connect(port)
        s.sendall(wire("POST", "/v1/completions", json.dumps({"prompt": TEXT_PROMPTS[i % len(TEXT_PROMPTS)],
                                                              "max_tokens": 4000, "ignore_eos": True,
                                                              "stream": True}).encode()))
        holders.append(s)
    try:
        deadline = time.time() + ANSWER_SECONDS
        while True:
            m = metrics(port)
            if m["kite_requests_running"] + m["kite_requests_waiting"] == MAX_BATCH + MAX_QUEUE:
                break
            if time.time() > deadline:
                fail("fill the queue", "the holders were not all admitted: %s" % m)
                return
            time.sleep(0.02)
        rng = random.Random(seed)
        for i in range(24):
            client = Client(port, rng, "over%d" % i)
            path, body, _ = client.generation()
            s = connect(port)
            try:
                s.sendall(wire("POST", path, body))
                status, headers, data = Reader(s).response()
            finally:
                s.close()
            if status != 503 or headers.get("retry-after") != "1" or json.loads(data)["error"]["code"] != 503:
                fail("past --max-queue #%d" % i, "%d %s %r" % (status, headers, data[:200]))
            else:
                count("503 past --max-queue")
    finally:
        for s in holders[MAX_BATCH:] + holders[:MAX_BATCH]:  # the waiting ones first
            s.close()


def main():
    server = KiteServer(args.kite, MODEL, "--max-batch", str(MAX_BATCH), "--max-queue", str(MAX_QUEUE),
                        "--timeout", str(TIMEOUT), "--drain-timeout", "5")
    started = time.time()
    try:
        asan = under_address_sanitizer(server.process.pid)
        rounds = args.rounds
        if asan and rounds > 1:
            # RSS is not judged under the sanitizer (its quarantine holds freed memory), so a second round,
            # there to show that memory does not grow round after round, would only double the time
            print("AddressSanitizer: one round of the load, RSS not judged", flush=True)
            rounds = 1
        warm_up = Client(server.port, random.Random(args.seed), "warm-up")
        for chat in (False, True):
            while True:
                path, body, check = warm_up.generation()
                if path.endswith("chat/completions") == chat:
                    break
            check(*warm_up.keep_alive_request("POST", path, body))
        wait_until_idle(server.port, "the warm-up")
        time.sleep(IDLE_SECONDS)
        baseline = rss_bytes(server.process.pid)
        print("baseline RSS %.1f MiB" % (baseline / 2 ** 20), flush=True)
        rss = []
        for round_index in range(rounds):
            stalled = stalled_headers(server.port, 16)
            clients = [Client(server.port, random.Random(args.seed * 1000 + round_index * 100 + i),
                              "round%d.client%d" % (round_index, i)) for i in range(args.clients)]
            threads = [threading.Thread(target=c.run, args=(args.actions,)) for c in clients]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            burst(server.port, args.seed + round_index, 3 * (MAX_BATCH + MAX_QUEUE))
            check_stalled_closed(stalled)
            fill_the_queue(server.port, args.seed + round_index)
            if server.process.poll() is not None:
                fail("round %d" % round_index, "the server exited with %s" % server.process.returncode)
                break
            wait_until_idle(server.port, "round %d" % round_index)
            time.sleep(IDLE_SECONDS)
            rss.append(rss_bytes(server.process.pid))
            print("round %d: %.1f s, RSS %.1f MiB idle a second" % (round_index, time.time() - started, rss[-1] / 2 ** 20),
                  flush=True)
            if rss[-1] - baseline > RSS_BOUND_BYTES and not asan:
                fail("RSS", "%.1f MiB a second after round %d, %.1f MiB before the load (bound: %d MiB more)"
                     % (rss[-1] / 2 ** 20, round_index, baseline / 2 ** 20, RSS_BOUND_BYTES >> 20))
        if len(rss) >= 2 and rss[-1] - rss[0] > RSS_GROWTH_BYTES:
            fail("RSS", "%.1f MiB idle after round 0, %.1f MiB after round %d (bound: %d MiB more)"
                 % (rss[0] / 2 ** 20, rss[-1] / 2 ** 20, len(rss) - 1, RSS_GROWTH_BYTES >> 20))
        if server.process.poll() is None:
            log = server.access_log()
            errors = [e for e in log if e["status"] >= 500 and e["status"] != 503]
            if errors:
                fail("access log", "%d answers with a 5xx other than 503, e.g. %s" % (len(errors), errors[:3]))
            print("access log: %d requests answered; %s" % (len(log), ", ".join(
                "%s %d" % (k, v) for k, v in sorted(counts.items()))), flush=True)
            try:
                server.stop()
            except AssertionError as e:
                fail("SIGTERM", e)
    finally:
        server.kill()
        server.reader.join(10)
    print("%.1f s" % (time.time() - started))
    if failures:
        print("FAIL serve_load_test: %d failures (seed %d); the first ones:" % (len(failures), args.seed))
        for f in failures[:25]:
            print("  " + f)
        lines = server.lines
        access = [i for i, line in enumerate(lines) if line.startswith('{"log":"access"')]
        left_out = set(access[:-40])
        print("---- the server's log (%d lines; all but the last 40 access lines) ----" % len(lines))
        sys.stdout.write("".join(line for i, line in enumerate(lines) if i not in left_out))
        print("0 passed, 1 failed")
        sys.exit(1)
    print("1 passed, 0 failed")


main()

#!/usr/bin/env python3
"""kite-serve-bench (bench/serve_bench.c) over loopback: against `kite serve` on tiny-vocab1k (CPU), both
datasets, closed and open loop, a reference made by `kite run` (and a wrong one, which fails the gate); against a
fake server in this file, which answers correctly (the gate passes, and the generator's requests carry the fields
it must send over keep-alive connections) and then breaks one rule at a time (max_tokens not honoured, another
finish reason, no usage, no [DONE], an error event, HTTP 500): each fails the gate, prints no figure, appends no
row and exits 1."""
import argparse, http.server, json, os, socket, subprocess, sys, tempfile, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("--bench", required=True)
ap.add_argument("--kite", required=True)
ap.add_argument("--data", required=True)
ap.add_argument("--text", required=True)
args = ap.parse_args()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from cases import case, finish  # noqa: E402

# tiny-vocab1k: the tiny checkpoint with a 1,024-id vocabulary (what is checked is the generator against kite itself)
MODEL_NAME = "tiny-vocab1k"
MODEL = os.path.join(args.data, MODEL_NAME)
work = tempfile.mkdtemp(prefix="serve_bench_test.")


def bench(port, *extra, out=None):
    """Runs the generator; returns (exit code, stdout, stderr)."""
    cmd = [args.bench, "--tokenizer", MODEL, "--text", args.text, "--port", str(port), "--wait", "30",
           "--timeout", "60", *extra]
    if out:
        cmd += ["--out", out]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def check_row(row, n, output_len):
    assert row["test"] == "serve" and row["gate"] == "pass" and row["failed"] == 0, row
    assert row["completed"] == n and row["num_requests"] == n, row
    assert row["total_output_tokens"] == n * output_len, row
    for k in ("gpu", "commit", "date", "command", "server", "model", "dataset"):
        assert isinstance(row[k], str) and row[k], (k, row)
    assert row["tok_s"] > 0 and row["request_throughput"] > 0 and row["total_tok_s"] > row["tok_s"], row
    for m in ("ttft", "tpot", "itl", "e2el"):
        p50, p90, p99 = row[m + "_ms_p50"], row[m + "_ms_p90"], row[m + "_ms_p99"]
        assert 0 <= p50 <= p90 <= p99, (m, row)
    assert row["ttft_ms_p50"] <= row["e2el_ms_p50"], row


# ---- against kite serve ----
server = subprocess.Popen([args.kite, "serve", "--model", MODEL, "--port", "0", "--backend", "cpu", "--threads", "2",
                           "--max-step-tokens", "64"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
server_err = []
threading.Thread(target=lambda: server_err.extend(server.stderr), daemon=True).start()
line = server.stdout.readline()
assert line.startswith("listening on "), line
port = int(line.strip().rsplit(":", 1)[1])

out = os.path.join(work, "serve.jsonl")
reference = os.path.join(work, "reference.jsonl")
with open(reference, "w") as f:
    for prompt in ("The capital of France is", "def fibonacci(n):"):
        r = subprocess.run([args.kite, "run", "--model", MODEL, "--prompt", prompt, "--max-tokens", "4", "--ignore-eos",
                            "--temperature", "0", "--backend", "cpu", "--json"], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        f.write([l for l in r.stdout.splitlines() if l.startswith("{")][-1] + "\n")


@case
def closed_loop_random_with_reference():
    code, stdout, stderr = bench(port, "--dataset", "random", "--input-len", "16", "--output-len", "4",
                                 "--num-requests", "6", "--concurrency", "2", "--warmup", "2", "--reference", reference,
                                 "--gpu", "cpu", "--commit", "test", out=out)
    assert code == 0, stderr
    assert "gate: pass" in stdout and "2 reference completions match" in stdout and "TTFT ms" in stdout, stdout
    row = rows(out)[-1]
    check_row(row, 6, 4)
    assert row["dataset"] == "random" and row["concurrency"] == 2 and row["request_rate"] == "inf", row
    assert row["reference_prompts"] == 2 and row["server"] == "kite" and row["model"] == MODEL_NAME, row
    # The server's own count of the prompt: a decoded 16-token window tokenizes back to about 16.
    assert 12 <= row["prompt_tokens_min"] <= row["prompt_tokens_max"] <= 20, row
    assert row["gpu"] == "cpu" and row["commit"] == "test" and "--concurrency 2" in row["command"], row


@case
def open_loop_shared_prefix():
    code, stdout, stderr = bench(port, "--dataset", "shared-prefix", "--prefix-len", "32", "--input-len", "8",
                                 "--output-len", "3", "--num-requests", "5", "--rate", "40", "--server", "kite serve",
                                 out=out)
    assert code == 0, stderr
    row = rows(out)[-1]
    check_row(row, 5, 3)
    assert row["dataset"] == "shared-prefix" and row["prefix_len"] == 32 and row["input_len"] == 8, row
    assert row["concurrency"] is None and row["request_rate"] == 40, row
    assert row["server"] == "kite serve" and "'kite serve'" in row["command"], row
    assert 34 <= row["prompt_tokens_min"] <= row["prompt_tokens_max"] <= 46, row


@case
def open_loop_capped():
    code, stdout, stderr = bench(port, "--input-len", "8", "--output-len", "2", "--num-requests", "4", "--rate", "100",
                                 "--concurrency", "2", out=out)
    assert code == 0, stderr
    row = rows(out)[-1]
    check_row(row, 4, 2)
    assert row["concurrency"] == 2 and row["request_rate"] == 100, row


@case
def wrong_reference_fails_the_gate():
    wrong = os.path.join(work, "wrong.jsonl")
    with open(reference) as f:
        line = json.loads(f.readline())
    line["text"] = line["text"] + "!"
    with open(wrong, "w") as f:
        f.write(json.dumps(line) + "\n")
    before = len(rows(out))
    code, stdout, stderr = bench(port, "--input-len", "8", "--output-len", "4", "--num-requests", "2",
                                 "--reference", wrong, out=out)
    assert code == 1, (code, stderr)
    assert "FAILED reference request 0: the completion differs from the reference" in stderr, stderr
    assert "the gate failed: no figures" in stderr and "tok/s" not in stdout, (stdout, stderr)
    assert len(rows(out)) == before


@case
def usage_errors():
    code, _, stderr = bench(port, "--dataset", "sharegpt")
    assert code == 2 and "--dataset 'sharegpt'" in stderr, stderr
    code, _, stderr = bench(port, "--rate", "0")
    assert code == 2 and "--rate" in stderr, stderr
    code, _, stderr = bench(port, "--input-len", "100000", "--num-requests", "1")
    assert code == 1 and "a window of 100000 needs a longer text" in stderr, stderr


# ---- against a fake server ----
class Fake:
    mode = "ok"
    bodies = []
    connections = 0
    lock = threading.Lock()


class FakeHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # Each event leaves at once (no Nagle), so that the gaps the generator times are the fake's own.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with Fake.lock:
            Fake.connections += 1

    def log_message(self, *a):
        pass

    def send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self.send_json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "fake"}]})
        else:
            self.send_json(404, {"error": {"message": "no route"}})

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def event(self, obj):
        self.chunk(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with Fake.lock:
            Fake.bodies.append(body)
        mode = Fake.mode
        if mode == "status500":
            return self.send_json(500, {"error": {"message": "boom"}})
        k = body["max_tokens"] - (1 if mode == "short" else 0)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(k):
            last = i == k - 1
            reason = ("stop" if mode == "stop" else "length") if last else None
            self.event({"choices": [{"index": 0, "text": " t%d" % i, "finish_reason": reason}], "usage": None})
            if mode == "error" and i == 1:
                self.event({"error": {"message": "engine fell over", "code": 500}})
                break
            time.sleep(0.002)
        if mode != "no_usage":
            self.event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": k, "total_tokens": 7 + k}})
        if mode != "no_done":
            self.event(b"[DONE]")
        self.chunk(b"")


fake = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeHandler)
fake.daemon_threads = True
threading.Thread(target=fake.serve_forever, daemon=True).start()
fake_port = fake.server_address[1]


@case
def fake_server_correct_passes():
    Fake.mode, Fake.bodies, Fake.connections = "ok", [], 0
    fake_out = os.path.join(work, "fake.jsonl")
    code, stdout, stderr = bench(fake_port, "--input-len", "8", "--output-len", "5", "--num-requests", "8",
                                 "--concurrency", "2", "--warmup", "2", out=fake_out)
    assert code == 0, stderr
    row = rows(fake_out)[-1]
    check_row(row, 8, 5)
    assert row["model"] == "fake" and row["server"] == "fake" and row["prompt_tokens_mean"] == 7, row
    assert len(Fake.bodies) == 10, len(Fake.bodies)
    for b in Fake.bodies:
        assert b["model"] == "fake" and b["max_tokens"] == 5 and b["temperature"] == 0, b
        assert b["stream"] is True and b["ignore_eos"] is True and b["stream_options"] == {"include_usage": True}, b
        assert isinstance(b["prompt"], str) and b["prompt"], b
    # Keep-alive: two requests in flight at most, so two connections for the completions (and /health,
    # /v1/models on one of them).
    assert Fake.connections <= 2, Fake.connections
    # The streams' timing: five chunks, so four gaps each; the fake sleeps 2 ms between chunks.
    assert row["itl_ms_p50"] >= 1.5 and row["tpot_ms_p50"] >= 1.5, row


def broken(mode, message):
    Fake.mode = mode
    fake_out = os.path.join(work, "fake-%s.jsonl" % mode)
    code, stdout, stderr = bench(fake_port, "--input-len", "8", "--output-len", "5", "--num-requests", "3",
                                 "--concurrency", "3", "--warmup", "0", out=fake_out)
    assert code == 1, (mode, code, stdout, stderr)
    assert message in stderr and "the gate failed: no figures" in stderr, (mode, stderr)
    assert "tok/s" not in stdout and "TTFT" not in stdout, (mode, stdout)
    assert rows(fake_out) == [], mode


@case
def fake_server_max_tokens_not_honoured():
    broken("short", "usage.completion_tokens 4, not max_tokens 5")


@case
def fake_server_other_finish_reason():
    broken("stop", 'finish_reason "stop", not "length"')


@case
def fake_server_no_usage():
    broken("no_usage", "no usage in the stream")


@case
def fake_server_no_done():
    broken("no_done", "the body ended before data: [DONE]")


@case
def fake_server_error_event():
    broken("error", "the server sent an error event: engine fell over")


@case
def fake_server_http_500():
    broken("status500", "HTTP 500")


fake.shutdown()
server.terminate()
try:
    code = server.wait(30)
except subprocess.TimeoutExpired:
    server.kill()
    raise
assert code == 0, (code, "".join(server_err[-20:]))
finish()

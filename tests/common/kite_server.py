"""One `kite serve` process for kite's Python tests (tests/cli): started on a free loopback port, waited for
until /health says the model is ready, its stderr (the access log among it) collected by a thread so that the
pipe never fills, and stopped with SIGTERM, checking that every KV block came back."""
import http.client, json, os, signal, subprocess, threading, time


class KiteServer:
    def __init__(self, kite, model_dir, *extra, host="127.0.0.1", env=None, threads=2):
        self.process = subprocess.Popen([kite, "serve", "--model", model_dir, "--port", "0", "--host", host,
                                         "--backend", "cpu", "--threads", str(threads), "--max-step-tokens", "64",
                                         *extra],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env=dict(os.environ, **(env or {})))
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        line = self.process.stdout.readline()  # "listening on HOST:PORT", printed once the socket listens
        if not line.startswith("listening on "):
            self.process.kill()
            self.reader.join(10)
            raise RuntimeError("server did not start: %r %s" % (line, "".join(self.lines)))
        self.port = int(line.strip().rsplit(":", 1)[1])
        self.host = host
        self.wait_until_ready()

    def _read(self):
        for line in self.process.stderr:
            self.lines.append(line)

    def wait_until_ready(self, deadline_seconds=60):
        """/health answers 503 while the model loads, 200 once it is ready."""
        deadline = time.time() + deadline_seconds
        while time.time() < deadline:
            c = http.client.HTTPConnection(self.host, self.port, timeout=10)
            try:
                c.request("GET", "/health")
                r = c.getresponse()
                body = r.read()
                if r.status == 200:
                    return
                assert r.status == 503 and json.loads(body)["status"] == "loading", (r.status, body)
            except ConnectionError:
                pass
            finally:
                c.close()
            time.sleep(0.05)
        raise AssertionError("the server did not become ready")

    def metric(self, name):
        """The value of one unlabelled series of /metrics (kite_requests_running, ...)."""
        c = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            c.request("GET", "/metrics")
            r = c.getresponse()
            text = r.read().decode()
        finally:
            c.close()
        assert r.status == 200, (r.status, text)
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError("no %s in /metrics: %s" % (name, text))

    def access_log(self):
        return [json.loads(l) for l in list(self.lines) if l.startswith('{"log":"access"')]

    def stop(self, timeout=30):
        """SIGTERM; returns the exit code and asserts that every KV block came back."""
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError("the server did not stop within %d s" % timeout)
        self.reader.join(10)
        stopped = [l for l in self.lines if l.startswith("kite serve: stopped; KV blocks free ")]
        assert code == 0, (code, "".join(self.lines[-20:]))
        assert stopped, self.lines[-5:]
        free, total = stopped[-1].split("free ")[1].split(" of ")
        assert int(free) == int(total), stopped[-1]
        return code

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()

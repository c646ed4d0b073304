#!/usr/bin/env python3
"""The official OpenAI client (npm `openai`) against `kite serve` (issue 37, item 8): installs the package into a
cache folder outside the source tree (the build folder: `npm install --no-save --prefix CACHE`), starts two servers
on loopback, and runs tests/cli/openai_client_test.mjs against them.

  - the tiny checkpoint: models list/retrieve, completions (plain, streamed, usage) against `kite run`'s text,
    n seeded choices streamed with logprobs against the whole response, echo with max_tokens 0,
    chat against `kite run` on the rendered prompt, errors (400 naming the field, 401, 404);
  - a scripted checkpoint (tests/common/scripted_checkpoint.py): the tiny model's shapes with weights that make
    greedy decoding a fixed chain of tokens. After a chat prompt it writes "<think>ok</think>Sure<tool_call>
    {...get_weather...}</tool_call>" and the end of text, and it continues the openings of tool_choice "required"
    and of a named function with the rest of that call (with thinking on, inserted after its "</think>"), which is
    how reasoning_content, tool_calls and forced tool choices are tested end to end with a model that cannot write
    them by chance.

Without node/npm, or when npm cannot install the package (no network), the test is skipped (exit 77) with a line
saying why; it never passes without running."""
import argparse, json, os, shutil, subprocess, sys, tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--kite", required=True)
ap.add_argument("--data", required=True)
ap.add_argument("--cache", required=True, help="where npm installs the openai package (outside the sources)")
args = ap.parse_args()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from kite_server import KiteServer  # noqa: E402
import scripted_checkpoint  # noqa: E402

OPENAI_PACKAGE = "openai@6"  # the major version the .mjs is written against
API_KEY = "kite-test-key"
TINY = os.path.join(args.data, "tiny")


def skip(why):
    print("SKIPPED: openai_client_test: " + why, flush=True)
    sys.exit(77)


def install_openai():
    """node_modules/openai under the cache folder; reused when it is there already."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        skip("node and npm are needed to run the npm openai package (not found on PATH)")
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    if int(version.lstrip("v").split(".")[0]) < 18:
        skip("node %s is older than 18, the oldest the openai package supports" % version)
    installed = os.path.join(args.cache, "node_modules", "openai", "package.json")
    major = OPENAI_PACKAGE.split("@")[1]
    if os.path.exists(installed):
        with open(installed) as f:
            if json.load(f)["version"].split(".")[0] != major:
                os.remove(installed)  # another major version: install the one the .mjs is written for
    if not os.path.exists(installed):
        os.makedirs(args.cache, exist_ok=True)
        try:
            p = subprocess.run([npm, "install", "--no-save", "--no-package-lock", "--no-audit", "--no-fund",
                                "--fetch-retries=1", "--fetch-timeout=30000", "--prefix", args.cache, OPENAI_PACKAGE],
                               capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            skip("npm install %s took more than 300 s (no network?)" % OPENAI_PACKAGE)
        if p.returncode != 0 or not os.path.exists(installed):
            tail = " | ".join((p.stderr or p.stdout).strip().splitlines()[-3:])
            skip("npm install %s failed (no network?): %s" % (OPENAI_PACKAGE, tail))
    with open(installed) as f:
        print("openai package %s (node %s) from %s" % (json.load(f)["version"], version, args.cache), flush=True)
    return node


# ---- references from `kite run` ----

def kite_run(*cli):
    p = subprocess.run([args.kite, "run", "--model", TINY, *cli, "--ignore-eos", "--json", "--backend", "cpu",
                        "--threads", "2"], capture_output=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError("kite run failed: %s" % p.stderr.decode(errors="replace"))
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


def references(folder):
    out = {"completion": kite_run("--prompt", "The capital of France is", "-n", "8")}
    request = os.path.join(folder, "chat.json")
    with open(request, "w") as f:
        json.dump({"messages": [{"role": "user", "content": "Hello!"}]}, f)
    p = subprocess.run([args.kite, "template", "--model", TINY, "--request", request, "--json"], capture_output=True,
                       timeout=60)
    ids = json.loads(p.stdout)["ids"]
    out["chat"] = kite_run("--prompt-ids", ",".join(map(str, ids)), "-n", "6")
    return out


def main():
    node = install_openai()
    with tempfile.TemporaryDirectory() as folder:
        scripted = os.path.join(folder, "scripted")
        scripted_checkpoint.write_scripted_checkpoint(TINY, scripted)
        refs = references(folder)
        servers = []
        try:
            servers.append(KiteServer(args.kite, TINY, "--api-key", API_KEY))
            servers.append(KiteServer(args.kite, scripted, "--api-key", API_KEY))
            env = dict(os.environ, KITE_OPENAI_MODULES=os.path.join(args.cache, "node_modules"),
                       KITE_TINY_URL="http://127.0.0.1:%d/v1" % servers[0].port,
                       KITE_SCRIPTED_URL="http://127.0.0.1:%d/v1" % servers[1].port, KITE_API_KEY=API_KEY,
                       KITE_REFERENCES=json.dumps(refs),
                       KITE_SCRIPTED_TOKENS=json.dumps({"answer": scripted_checkpoint.ANSWER_TOKENS,
                                                        "required": scripted_checkpoint.REQUIRED_TOKENS,
                                                        "named": scripted_checkpoint.NAMED_TOKENS,
                                                        # <think>, ok, </think> before an inserted opening
                                                        "thought": 3}))
            p = subprocess.run([node, os.path.join(HERE, "openai_client_test.mjs")], env=env, timeout=300)
            code = p.returncode
            for s in servers:
                try:
                    s.stop()
                except AssertionError as e:
                    print("FAIL the server did not stop cleanly: %s" % e)
                    code = code or 1
            if code != 0:
                for s in servers:
                    print("---- server log (last 40 lines) ----")
                    sys.stdout.write("".join(s.lines[-40:]))
            sys.exit(1 if code else 0)
        finally:
            for s in servers:
                s.kill()


main()

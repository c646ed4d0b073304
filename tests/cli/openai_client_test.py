#!/usr/bin/env python3
"""The official OpenAI client (npm `openai`) against `kite serve` (issue 37, item 8): installs the package into a
cache folder outside the source tree (the build folder: `npm install --no-save --prefix CACHE`), starts two servers
on loopback, and runs tests/cli/openai_client_test.mjs against them.

  - the tiny checkpoint: models list/retrieve, completions (plain, streamed, usage) against `kite run`'s text,
    n seeded choices streamed with logprobs against the whole response, echo with max_tokens 0,
    chat against `kite run` on the rendered prompt, errors (400 naming the field, 401, 404);
  - a scripted checkpoint written here: the tiny model's shapes with weights that make greedy decoding a fixed
    chain of tokens (each token's embedding is its own one-hot direction, the attention and MLP outputs are zero,
    so the residual stream is the current token's embedding and lm_head maps it to the next one). After a chat
    prompt it writes "<think>ok</think>Sure<tool_call>{...get_weather...}</tool_call>" and the end of text, which
    is how reasoning_content and tool_calls are tested end to end with a model that cannot write them by chance.

Without node/npm, or when npm cannot install the package (no network), the test is skipped (exit 77) with a line
saying why; it never passes without running."""
import argparse, json, os, shutil, struct, subprocess, sys, tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--kite", required=True)
ap.add_argument("--data", required=True)
ap.add_argument("--cache", required=True, help="where npm installs the openai package (outside the sources)")
args = ap.parse_args()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from kite_server import KiteServer  # noqa: E402

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


# ---- the scripted checkpoint ----

def bf16(value):
    return struct.pack("<f", value)[2:]  # the upper half of a float32: exact for 0, 1 and 10


def write_safetensors(path, tensors):
    """tensors: [(name, shape, bytes)] in bf16."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, data in tensors:
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, _, data in tensors:
            f.write(data)


def scripted_checkpoint(folder):
    """The tiny checkpoint's shapes and tokenizer with weights whose greedy output after "\\n" (the end of a chat
    prompt) is the chain below, whatever came before. Returns the text it writes."""
    with open(os.path.join(TINY, "config.json")) as f:
        config = json.load(f)
    config["tie_word_embeddings"] = False
    with open(os.path.join(TINY, "tokenizer.json")) as f:
        tokenizer = json.load(f)
    vocab = dict(tokenizer["model"]["vocab"])
    vocab.update({t["content"]: t["id"] for t in tokenizer["added_tokens"]})
    pieces = ["Ċ", "<think>", "ok", "</think>", "Sure", "<tool_call>", '{"', "name", '":"', "get", "_weather", '","',
              "arguments", '":{"', "city", '":', '"', "Paris", '"}}', "</tool_call>", "<|endoftext|>"]
    chain = [vocab[p] for p in pieces]
    hidden, vocab_size = config["hidden_size"], config["vocab_size"]
    assert len(set(chain)) == len(chain) and len(chain) - 1 <= hidden, chain
    assert chain[-1] == config["eos_token_id"], (chain[-1], config["eos_token_id"])
    embed, head = bytearray(vocab_size * hidden * 2), bytearray(vocab_size * hidden * 2)
    for i, token in enumerate(chain[:-1]):
        embed[(token * hidden + i) * 2:(token * hidden + i) * 2 + 2] = bf16(1.0)
        successor = chain[i + 1]
        head[(successor * hidden + i) * 2:(successor * hidden + i) * 2 + 2] = bf16(10.0)

    def zeros(*shape):
        n = 1
        for s in shape:
            n *= s
        return bytes(2 * n)

    def ones(n):
        return bf16(1.0) * n
    heads, kv_heads, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    inter = config["intermediate_size"]
    tensors = [("model.embed_tokens.weight", [vocab_size, hidden], bytes(embed)),
               ("lm_head.weight", [vocab_size, hidden], bytes(head)), ("model.norm.weight", [hidden], ones(hidden))]
    for layer in range(config["num_hidden_layers"]):
        p = "model.layers.%d." % layer
        tensors += [(p + "input_layernorm.weight", [hidden], ones(hidden)),
                    (p + "post_attention_layernorm.weight", [hidden], ones(hidden)),
                    (p + "self_attn.q_norm.weight", [head_dim], ones(head_dim)),
                    (p + "self_attn.k_norm.weight", [head_dim], ones(head_dim)),
                    (p + "self_attn.q_proj.weight", [heads * head_dim, hidden], zeros(heads * head_dim, hidden)),
                    (p + "self_attn.k_proj.weight", [kv_heads * head_dim, hidden], zeros(kv_heads * head_dim, hidden)),
                    (p + "self_attn.v_proj.weight", [kv_heads * head_dim, hidden], zeros(kv_heads * head_dim, hidden)),
                    (p + "self_attn.o_proj.weight", [hidden, heads * head_dim], zeros(hidden, heads * head_dim)),
                    (p + "mlp.gate_proj.weight", [inter, hidden], zeros(inter, hidden)),
                    (p + "mlp.up_proj.weight", [inter, hidden], zeros(inter, hidden)),
                    (p + "mlp.down_proj.weight", [hidden, inter], zeros(hidden, inter))]
    os.makedirs(folder)
    write_safetensors(os.path.join(folder, "model.safetensors"), tensors)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(TINY, name), folder)


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
        scripted_checkpoint(scripted)
        refs = references(folder)
        servers = []
        try:
            servers.append(KiteServer(args.kite, TINY, "--api-key", API_KEY))
            servers.append(KiteServer(args.kite, scripted, "--api-key", API_KEY))
            env = dict(os.environ, KITE_OPENAI_MODULES=os.path.join(args.cache, "node_modules"),
                       KITE_TINY_URL="http://127.0.0.1:%d/v1" % servers[0].port,
                       KITE_SCRIPTED_URL="http://127.0.0.1:%d/v1" % servers[1].port, KITE_API_KEY=API_KEY,
                       KITE_REFERENCES=json.dumps(refs))
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

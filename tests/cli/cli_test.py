#!/usr/bin/env python3
"""End-to-end tests of `kite run`, `kite tokenize`, `kite detokenize` and `kite info` on the tiny
checkpoints of tests/data, against the transformers references there (made by tests/data/tools); the cases that
check kite against itself or its messages run on tiny-vocab1k, whose 1,024-id vocabulary makes a token cheap."""
import argparse, json, os, shutil, struct, subprocess, sys, tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--kite", required=True)
ap.add_argument("--data", required=True)
args = ap.parse_args()
KITE, DATA = args.kite, args.data
SMALL = os.path.join(DATA, "tiny-vocab1k")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from cases import case, finish  # noqa: E402


def run(*argv, check_exit=None, env=None):
    p = subprocess.run([KITE, *argv], capture_output=True, timeout=600,
                       env=None if env is None else {**os.environ, **env})
    if check_exit is not None and p.returncode != check_exit:
        raise AssertionError(f"kite {' '.join(argv)}: exit {p.returncode}, stderr: {p.stderr.decode(errors='replace')}")
    return p


def last_json(stdout):
    return json.loads(stdout.decode().rstrip("\n").split("\n")[-1])


@case
def greedy_tokens_and_logprobs_match_transformers():
    for name in ("tiny", "tiny-untied"):
        ref = json.load(open(os.path.join(DATA, name + ".reference.json")))
        for r in ref["results"]:
            ids = ",".join(map(str, r["prompt_ids"]))
            p = run("run", "--model", os.path.join(DATA, name), "--prompt-ids", ids, "--max-tokens", str(len(r["greedy"])),
                    "--ignore-eos", "--json", "--logprobs", "5", "--backend", "cpu", check_exit=0)
            out = last_json(p.stdout)
            assert out["tokens"] == r["greedy"], f"{name} {r['prompt'][:20]!r}: {out['tokens']} vs {r['greedy']}"
            assert out["finish_reason"] == "length"
            for step, (got, want) in enumerate(zip(out["logprobs"], r["steps"])):
                got_values = [t["logprob"] for t in got["top"]]
                for a, b in zip(got_values, want["top_logprobs"]):
                    assert abs(a - b) <= 1e-4, f"{name} step {step}: top-5 {got_values} vs {want['top_logprobs']}"
                assert abs(got["logprob"] - want["top_logprobs"][0]) <= 1e-4


@case
def text_prompt_goes_through_the_tokenizer_and_streams():
    ref = json.load(open(os.path.join(DATA, "tiny.reference.json")))
    r = ref["results"][0]
    p = run("run", "--model", os.path.join(DATA, "tiny"), "--prompt", r["prompt"], "--max-tokens", "16",
            "--ignore-eos", "--json", "--backend", "cpu", check_exit=0)
    lines = p.stdout.decode().split("\n")
    out = json.loads(lines[-2])
    assert out["prompt_tokens"] == r["prompt_ids"]
    assert out["tokens"] == r["greedy"][:16]
    streamed = p.stdout.decode()[: -(len(lines[-2]) + 2)]  # the text, then "\n", then the JSON line
    assert streamed == out["text"], f"streamed {streamed!r} != final {out['text']!r}"
    d = run("detokenize", "--model", os.path.join(DATA, "tiny"), *map(str, out["tokens"]), check_exit=0)
    assert d.stdout.decode().rstrip("\n") == out["text"]


@case
def tokenize_cli():
    p = run("tokenize", "--model", os.path.join(DATA, "tiny"), "--json", "Hello, my dog is cute", check_exit=0)
    assert json.loads(p.stdout) == {"ids": [9707, 11, 847, 5562, 374, 18838]}


@case
def stop_string_ends_generation_before_it():
    base = last_json(run("run", "--model", SMALL, "--prompt", "Hello", "--max-tokens", "24",
                         "--ignore-eos", "--json", "--backend", "cpu", check_exit=0).stdout)
    text = base["text"]
    assert len(text) > 8, text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    cut = text.index(stop)
    out = last_json(run("run", "--model", SMALL, "--prompt", "Hello", "--max-tokens", "24",
                        "--ignore-eos", "--json", "--backend", "cpu", "--stop", stop, check_exit=0).stdout)
    assert out["finish_reason"] == "stop", out
    assert out["text"] == text[:cut], f"{out['text']!r} vs {text[:cut]!r}"


@case
def seeded_sampling_is_reproducible():
    common = ["run", "--model", SMALL, "--prompt", "Hello", "--max-tokens", "24", "--ignore-eos",
              "--json", "--backend", "cpu", "--temperature", "1.0", "--top-p", "0.95"]
    a = last_json(run(*common, "--seed", "7", check_exit=0).stdout)["tokens"]
    b = last_json(run(*common, "--seed", "7", check_exit=0).stdout)["tokens"]
    c = last_json(run(*common, "--seed", "8", check_exit=0).stdout)["tokens"]
    assert a == b
    assert a != c


@case
def prompt_file_runs_as_one_batch_with_solo_tokens():
    ref = json.load(open(os.path.join(DATA, "tiny.reference.json")))
    with tempfile.TemporaryDirectory() as tmp:
        f = os.path.join(tmp, "prompts.txt")
        prompts = [r["prompt"] for r in ref["results"] if "\n" not in r["prompt"]]
        open(f, "w").write("\n".join(prompts) + "\n")
        p = run("run", "--model", os.path.join(DATA, "tiny"), "--prompt-file", f, "--max-tokens", "20", "--ignore-eos",
                "--json", "--backend", "cpu", check_exit=0)
        outs = [json.loads(l) for l in p.stdout.decode().strip().split("\n")]
        want = [r for r in ref["results"] if "\n" not in r["prompt"]]
        assert len(outs) == len(want)
        for o, r in zip(outs, want):
            assert o["tokens"] == r["greedy"][:20], (o["tokens"], r["greedy"][:20])


@case
def a_nul_byte_in_a_prompt_file_is_refused_with_its_line():
    # a prompt is a C string: a NUL would cut it short, so the line is refused (not truncated)
    with tempfile.TemporaryDirectory() as tmp:
        f = os.path.join(tmp, "prompts.txt")
        open(f, "wb").write(b"first prompt\n\nsecond\x00hidden\nthird\n")
        p = run("run", "--model", SMALL, "--prompt-file", f, "--max-tokens", "2",
                "--backend", "cpu")
        err = p.stderr.decode()
        assert p.returncode == 1 and p.stdout == b"", (p.returncode, p.stdout, err)
        assert err.count("\n") == 1 and f in err and "line 3" in err and "NUL" in err, err
        open(f, "wb").write(b"\x00\n")
        p = run("run", "--model", SMALL, "--prompt-file", f, "--backend", "cpu")
        assert p.returncode == 1 and "line 1" in p.stderr.decode(), p.stderr


def damaged(setup, expect):
    """Copies tiny-vocab1k, lets setup(dir) damage it, and checks exit code 1 with one stderr line naming it."""
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "ckpt")
        shutil.copytree(SMALL, d)
        setup(d)
        p = run("run", "--model", d, "--prompt-ids", "1,2,3", "--max-tokens", "2", "--backend", "cpu")
        err = p.stderr.decode()
        assert p.returncode == 1, f"exit {p.returncode}: {err}"
        assert err.count("\n") == 1, f"not one line: {err!r}"
        for word in expect:
            assert word in err, f"{word!r} not in {err!r}"


def rewrite_header(d, edit):
    path = os.path.join(d, "model.safetensors")
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    edit(header)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])


@case
def damaged_checkpoints_fail_cleanly():
    damaged(lambda d: os.remove(os.path.join(d, "config.json")), ["config.json"])
    damaged(lambda d: open(os.path.join(d, "config.json"), "w").write("{not json"), ["config.json"])
    damaged(lambda d: os.truncate(os.path.join(d, "model.safetensors"), 100_000), ["model.safetensors"])
    damaged(lambda d: open(os.path.join(d, "model.safetensors"), "wb").close(), ["model.safetensors"])
    damaged(lambda d: rewrite_header(d, lambda h: h.update({"model.norm.weights": h.pop("model.norm.weight")})),
            ["model.norm.weight"])
    damaged(lambda d: rewrite_header(d, lambda h: h["model.norm.weight"].update(dtype="Q4")), ["model.norm.weight"])

    def zero_heads(d):
        c = json.load(open(os.path.join(d, "config.json")))
        c["num_key_value_heads"] = 3  # 2 query heads over 3 kv heads
        json.dump(c, open(os.path.join(d, "config.json"), "w"))
    damaged(zero_heads, ["num_attention_heads"])
    damaged(lambda d: os.remove(os.path.join(d, "tokenizer.json")), ["tokenizer.json"])


def refused_quickly(argv, expect, stdin=None):
    """kite ARGV exits 1 within 30 s (a blocking open fails the case instead of hanging it) with one stderr line
    holding every string of expect."""
    p = subprocess.run([KITE, *argv], capture_output=True, timeout=30, input=stdin)
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 1, f"kite {' '.join(argv)}: exit {p.returncode}: {err}"
    assert err.count("\n") == 1, f"not one line: {err!r}"
    for word in expect:
        assert word in err, f"{word!r} not in {err!r}"


def remove_entry(path):
    if os.path.isdir(path) and not os.path.islink(path):
        os.rmdir(path)
    elif os.path.lexists(path):
        os.remove(path)


def replace_with(path, kind):
    remove_entry(path)
    if kind == "a FIFO":
        os.mkfifo(path)
    elif kind == "a directory":
        os.mkdir(path)
    else:
        os.symlink("/dev/null", path)


KINDS = ("a FIFO", "a directory", "a character device")


@case
def non_regular_files_are_refused_naming_them():
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "ckpt")
        shutil.copytree(SMALL, d)
        for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                     "generation_config.json", "chat_template.jinja"):
            path = os.path.join(d, name)
            saved = os.path.join(tmp, "saved")
            if os.path.exists(path):
                shutil.copyfile(path, saved)
            for kind in KINDS:
                replace_with(path, kind)
                refused_quickly(["run", "--model", d, "--prompt-ids", "1,2,3", "--max-tokens", "2", "--backend",
                                 "cpu"], [f"{path}: is not a regular file ({kind})"])
            remove_entry(path)
            if os.path.exists(saved):
                shutil.move(saved, path)
        prompts = os.path.join(tmp, "prompts.txt")
        request = os.path.join(tmp, "request.json")
        for kind in KINDS:
            replace_with(prompts, kind)
            refused_quickly(["run", "--model", d, "--prompt-file", prompts, "--max-tokens", "2", "--backend", "cpu"],
                            [f"--prompt-file: {prompts} is not a regular file ({kind})"])
            replace_with(request, kind)
            refused_quickly(["template", "--model", d, "--request", request],
                            [f"--request: {request} is not a regular file ({kind})"])
        # "-" still reads standard input, which is a pipe here.
        p = subprocess.run([KITE, "template", "--model", d, "--request", "-"], capture_output=True, timeout=30,
                           input=b'{"messages": [{"role": "user", "content": "hi"}]}')
        assert p.returncode == 0 and b"hi" in p.stdout, p.stderr


@case
def kv_budgets_beyond_memory_are_refused():
    refused_quickly(["run", "--model", SMALL, "--prompt-ids", "1,2,3", "--max-tokens", "2",
                     "--backend", "cpu", "--kv-cache-mb", str(1 << 30)], ["kv_cache_bytes", "host memory"])


@case
def usage_errors_exit_2():
    assert run("run", "--model", SMALL).returncode == 2
    assert run("run", "--model", SMALL, "--prompt", "x", "--top-p", "2").returncode == 2
    assert run("frobnicate").returncode == 2
    p = run("run", "--model", SMALL, "--prompt-ids", "999999999", "--backend", "cpu")
    assert p.returncode == 1 and "vocabulary" in p.stderr.decode(), p.stderr
    p = run("run", "--model", SMALL, "--prompt", "x", "--weights", "fp4")
    assert p.returncode == 2 and "--weights" in p.stderr.decode(), p.stderr


@case
def help_is_made_from_the_option_table():
    for command, flags in [("run", ["--prompt-ids", "--stop", "--threads", "--top-p"]),
                           ("serve", ["--port", "--served-model-name", "--kv-cache-mb"]),
                           ("tokenize", ["--model", "--json"]), ("detokenize", ["--model", "--json"])]:
        for help_flag in ("--help", "-h"):
            p = run(command, help_flag, check_exit=0)
            out = p.stdout.decode()
            assert out.startswith(f"usage: kite {command} "), out
            assert "-h, --help" in out and not p.stderr, (out, p.stderr)
            for flag in flags:
                assert flag in out, (command, flag, out)
    tiny = os.path.join(DATA, "tiny")
    for argv in (["serve", "--bogus"], ["serve"], ["serve", "--model", tiny, "--port", "70000"],
                 ["serve", "--model", tiny, "extra"], ["run", "--model", tiny, "--prompt", "x", "extra"],
                 ["run", "--model", tiny, "--prompt", "x", "--json=1"], ["run", "--model"],
                 ["run", "--model", tiny, "--prompt", "x", "--stop", ""],
                 ["run", "--model", tiny, "--prompt", "x", "--logprobs", "21"],
                 ["run", "--model", tiny, "--prompt", "x", "--backend", "tpu"]):
        p = run(*argv)
        assert p.returncode == 2, (argv, p.returncode, p.stderr)
        assert p.stderr.decode().startswith("kite"), (argv, p.stderr)


@case
def bench_rows_as_json_lines():
    p = run("bench", "--dummy", "tiny-vocab1k", "--backend", "cpu", "-p", "16", "-n", "4", "-b", "1,2", "--depth", "8",
            "-r", "2", "-o", "jsonl", check_exit=0)
    rows = [json.loads(l) for l in p.stdout.decode().strip().split("\n")]
    assert [(r["test"], r["batch"]) for r in rows] == [("pp16", 1), ("pp16", 2), ("tg4", 1), ("tg4", 2)], rows
    for r in rows:
        for key in ("test", "batch", "tok_s", "gpu", "commit", "date", "gate"):
            assert key in r, (key, r)
        assert r["tok_s"] > 0 and r["gate"] == "oracle"
        # greedy tg rows run as the engine's overlapped decode, unless KITE_ENGINE_OVERLAP=0
        assert r.get("overlapped") is (True if r["test"].startswith("tg") else None), r
    serial = run("bench", "--dummy", "tiny-vocab1k", "--backend", "cpu", "-p", "0", "-n", "3", "--depth", "4",
                 "-r", "1", "-o", "jsonl", check_exit=0, env={"KITE_ENGINE_OVERLAP": "0"})
    assert last_json(serial.stdout)["overlapped"] is False, serial.stdout
    assert run("bench", "--dummy", "nonexistent-shape", "--backend", "cpu").returncode == 1
    assert run("bench", "--dummy", "tiny-vocab1k", "-o", "xml").returncode == 2
    for r in rows:
        assert r["weights"] == "bf16", r
    fp8 = run("bench", "--dummy", "tiny-vocab1k", "--backend", "cpu", "--weights", "fp8", "-p", "8", "-n", "2",
              "-r", "1", "-o", "jsonl", check_exit=0)
    assert last_json(fp8.stdout)["weights"] == "fp8", fp8.stdout
    assert run("bench", "--dummy", "tiny-vocab1k", "--weights", "int8").returncode == 2
    for r in rows:
        assert r["kv_cache_dtype"] == "bf16", r
    fp8_kv = run("bench", "--dummy", "tiny-vocab1k", "--backend", "cpu", "--kv-cache-dtype", "fp8", "-p", "8",
                 "-n", "2", "-r", "1", "-o", "jsonl", check_exit=0)
    row = last_json(fp8_kv.stdout)
    assert row["kv_cache_dtype"] == "fp8" and row["gate"] == "oracle", fp8_kv.stdout
    assert run("bench", "--dummy", "tiny-vocab1k", "--kv-cache-dtype", "fp4").returncode == 2


@case
def kv_cache_dtype_fp8():
    # The same greedy run with either cache: both finish, and a dtype that is not bf16 or fp8 is a usage error.
    for command in ("run", "chat", "serve", "bench"):
        assert "--kv-cache-dtype" in run(command, "--help", check_exit=0).stdout.decode(), command
    for dtype in ("bf16", "fp8"):
        p = run("run", "--model", SMALL, "--backend", "cpu", "--prompt-ids", "1,2,3,4,5,6,7,8", "--max-tokens", "6",
                "--kv-cache-dtype", dtype, check_exit=0)
        assert p.stdout, (dtype, p.stderr)
    p = run("run", "--model", SMALL, "--prompt", "x", "--kv-cache-dtype", "int4")
    assert p.returncode == 2 and "--kv-cache-dtype" in p.stderr.decode(), p.stderr


YARN_CASES = {  # tests/data/yarn/NAME: the checkpoint it edits and its rope scaling, given here as --rope-scaling
    "tiny-yarn": ("tiny", '{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":1024}'),
    "tiny-yarn-legacy-type": ("tiny", '{"type":"yarn","factor":2.0,"mscale":0.8,"mscale_all_dim":1.0}'),
    "tiny-untied-yarn": ("tiny-untied", '{"rope_type":"yarn","factor":2.0,"beta_fast":16,"beta_slow":2,'
                                         '"truncate":false,"attention_factor":1.1}'),
}


@case
def rope_scaling_option_matches_transformers_yarn():
    # the plain checkpoints with --rope-scaling against transformers run on the checkpoints' YaRN config.json
    for name, (base, scaling) in YARN_CASES.items():
        ref = json.load(open(os.path.join(DATA, "yarn", name + ".reference.json")))
        for r in ref["results"][:2]:
            p = run("run", "--model", os.path.join(DATA, base), "--rope-scaling", scaling, "--prompt-ids",
                    ",".join(map(str, r["prompt_ids"])), "--max-tokens", str(len(r["greedy"])), "--ignore-eos",
                    "--json", "--logprobs", "5", "--backend", "cpu", check_exit=0)
            out = last_json(p.stdout)
            assert out["tokens"] == r["greedy"], f"{name} {r['prompt'][:20]!r}: {out['tokens']} vs {r['greedy']}"
            for step, (got, want) in enumerate(zip(out["logprobs"], r["steps"])):
                for a, b in zip([t["logprob"] for t in got["top"]], want["top_logprobs"]):
                    assert abs(a - b) <= 1e-4, f"{name} step {step}: {a} vs {b}"


@case
def a_prompt_past_the_context_limit_is_refused_before_any_work():
    ids = ",".join(str(i) for i in range(100, 108))  # 8 tokens
    p = run("run", "--model", SMALL, "--backend", "cpu", "--max-context", "8", "--prompt-ids", ids, "-n", "4", "--json")
    err = p.stderr.decode()
    assert p.returncode == 1 and p.stdout == b"", (p.returncode, p.stdout, err)
    for needle in ("the prompt has 8 tokens but the context limit is 8", "at most 7", "--max-context",
                   "up to the model's 4096", "--rope-scaling"):
        assert needle in err, (needle, err)
    # the limit minus one is served: one token, then the context is full
    p = run("run", "--model", SMALL, "--backend", "cpu", "--max-context", "8", "--prompt-ids", ids[:ids.rindex(",")],
            "-n", "4", "--json", check_exit=0)
    out = last_json(p.stdout)
    assert len(out["tokens"]) == 1 and out["finish_reason"] == "length", out
    # at the model's own limit the message offers YaRN only
    long_ids = ",".join(["100"] * 4096)
    p = run("run", "--model", SMALL, "--backend", "cpu", "--prompt-ids", long_ids, "-n", "1")
    err = p.stderr.decode()
    assert p.returncode == 1 and "the prompt has 4096 tokens but the context limit is 4096" in err, err
    assert "--max-context" not in err and "--rope-scaling" in err, err


@case
def max_context_lowers_and_rope_scaling_raises_the_limit():
    p = run("run", "--model", SMALL, "--backend", "cpu", "--max-context", "4097", "--prompt-ids", "1", "-n", "1")
    err = p.stderr.decode()
    assert p.returncode == 1 and "max_context (--max-context) 4097 is above the model's context limit 4096" in err, err
    yarn = '{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":4096}'
    run("run", "--model", SMALL, "--backend", "cpu", "--rope-scaling", yarn, "--max-context", "16384",
        "--prompt-ids", "1", "-n", "1", check_exit=0)
    p = run("run", "--model", SMALL, "--backend", "cpu", "--rope-scaling", yarn, "--max-context", "16385",
            "--prompt-ids", "1", "-n", "1")
    assert p.returncode == 1 and "context limit 16384 (YaRN" in p.stderr.decode(), p.stderr
    info = run("bench", "--dummy", "tiny-vocab1k", "--backend", "cpu", "--rope-scaling", yarn, "-p", "8", "-n", "0",
               "-r", "1", "-o", "jsonl", check_exit=0)
    assert json.loads(info.stdout.decode().strip().split("\n")[-1])["rope_scaling"] == yarn, info.stdout


@case
def a_bad_rope_scaling_is_refused_naming_the_field():
    for scaling, needle in [('{"rope_type":"dynamic","factor":2.0}', 'rope_scaling.rope_type is "dynamic"'),
                            ('{"rope_type":"yarn","factor":0.5}', "rope_scaling.factor is 0.5"),
                            ('{"rope_type":"yarn","factor":4.0,"beta_fast":1,"beta_slow":2}', "beta_fast (1)"),
                            ('{"rope_type":"yarn","factor":4.0,"orig":1024}', "rope_scaling.orig is not a YaRN"),
                            ('{"rope_type":"yarn"', "not valid JSON")]:
        p = run("run", "--model", SMALL, "--backend", "cpu", "--rope-scaling", scaling, "--prompt-ids", "1", "-n", "1")
        err = p.stderr.decode()
        assert p.returncode == 1 and needle in err and "--rope-scaling" in err, (scaling, p.returncode, err)
    assert run("run", "--model", SMALL, "--rope-scaling", "", "--prompt-ids", "1").returncode == 2


@case
def bench_sampled_decode_rows():
    # tg rows that sample on the host (as the engine does for temperature > 0) say so in the row
    p = run("bench", "--dummy", "tiny-vocab1k", "--backend", "cpu", "-p", "0", "-n", "3", "-b", "1,3", "--depth", "4",
            "-r", "1", "--temperature", "0.8", "--top-k", "5", "--top-p", "0.9", "-o", "jsonl", check_exit=0)
    rows = [json.loads(l) for l in p.stdout.decode().strip().split("\n")]
    assert [(r["test"], r["batch"]) for r in rows] == [("tg3", 1), ("tg3", 3)], rows
    for r in rows:
        chosen = {key: r["sampling"][key] for key in ("temperature", "top_k", "top_p")}
        assert r["tok_s"] > 0 and chosen == {"temperature": 0.8, "top_k": 5, "top_p": 0.9}, r
        assert r["overlapped"] is False, r
    greedy = run("bench", "--dummy", "tiny-vocab1k", "--backend", "cpu", "-p", "0", "-n", "2", "--depth", "4",
                 "-r", "1", "-o", "jsonl", check_exit=0)
    assert "sampling" not in json.loads(greedy.stdout.decode().strip()), greedy.stdout
    assert run("bench", "--dummy", "tiny-vocab1k", "--temperature", "-1").returncode == 2
    assert run("bench", "--dummy", "tiny-vocab1k", "--top-p", "1.5").returncode == 2


@case
def template_renders_as_transformers():
    chat = os.path.join(DATA, "chat")
    qwen3 = os.path.join(chat, "templates", "qwen3.jinja")
    for name in ("01-single-user", "33-tools-basic", "43-multi-step-tool-use", "27-unicode"):
        request = os.path.join(chat, "conversations", name + ".json")
        golden = open(os.path.join(chat, "goldens", "qwen3", name + ".txt"), "rb").read()
        ids = json.load(open(os.path.join(chat, "goldens", "qwen3", name + ".ids.json")))
        out = run("template", "--model", os.path.join(DATA, "tokenizer"), "--chat-template", qwen3, "--request",
                  request, check_exit=0).stdout
        assert out == golden, (name, out[-60:], golden[-60:])
        # the checkpoint's own template (tiny carries Qwen3's) and --json with the ids
        j = json.loads(run("template", "--model", os.path.join(DATA, "tiny"), "--request", request, "--json",
                           check_exit=0).stdout)
        assert j["text"].encode("utf-8") == golden and j["ids"] == ids, name
        assert "insert_ids" not in j, name
    with tempfile.TemporaryDirectory() as d:
        # a forced tool choice: with thinking the opening is the engine's insertion after </think>; without, the
        # prompt's end
        tools = json.load(open(os.path.join(chat, "conversations", "33-tools-basic.json")))
        forced = os.path.join(d, "forced.json")
        json.dump(dict(tools, tool_choice="required"), open(forced, "w"))
        j = json.loads(run("template", "--model", os.path.join(DATA, "tiny"), "--request", forced, "--json",
                           check_exit=0).stdout)
        assert j["insert_ids"] and isinstance(j["insert_after"], int), j.keys()
        assert not j["text"].endswith('{"name": "'), j["text"][-40:]
        json.dump(dict(tools, tool_choice="required", chat_template_kwargs={"enable_thinking": False}),
                  open(forced, "w"))
        j = json.loads(run("template", "--model", os.path.join(DATA, "tiny"), "--request", forced, "--json",
                           check_exit=0).stdout)
        assert "insert_ids" not in j and j["text"].endswith('<tool_call>\n{"name": "'), j["text"][-40:]
        bad = os.path.join(d, "bad.json")
        open(bad, "w").write('{"messages": [{"role": "user"}], "tool_choice": "required"}')
        p = run("template", "--model", os.path.join(DATA, "tiny"), "--request", bad)
        assert p.returncode == 1 and p.stderr.decode().count("\n") == 1 and b"tool_choice" in p.stderr, p.stderr
        broken = os.path.join(d, "broken.jinja")
        open(broken, "w").write("ok\n{% for x in y %}\n{{ x }")
        p = run("template", "--model", os.path.join(DATA, "tiny"), "--chat-template", broken, "--request", bad)
        assert p.returncode == 1 and b"broken.jinja" in p.stderr, p.stderr
    assert run("template", "--model", os.path.join(DATA, "tiny")).returncode == 2


@case
def chat_reads_a_conversation_from_a_pipe():
    argv = [KITE, "chat", "--model", SMALL, "--backend", "cpu", "--threads", "2",
            "--max-tokens", "5", "--seed", "3", "--show-thinking"]
    turns = b"Hello\n/no_think\nAnd now?\n/bogus\n/reset\nThird\n"
    first = subprocess.run(argv, input=turns, capture_output=True, timeout=600)
    assert first.returncode == 0, first.stderr
    assert b"unknown command /bogus" in first.stderr, first.stderr
    assert first.stdout.count(b"\n") >= 3 and b"\x1b[" not in first.stdout, first.stdout  # no escapes into a pipe
    again = subprocess.run(argv, input=turns, capture_output=True, timeout=600)
    assert again.stdout == first.stdout  # the same seeds, the same answers
    none = subprocess.run([KITE, "chat", "--model", SMALL, "--backend", "cpu"], input=b"",
                          capture_output=True, timeout=600)
    assert none.returncode == 0 and none.stdout == b"", none


@case
def info_names_the_backends():
    out = run("info", check_exit=0).stdout.decode()
    assert "cpu" in out and "cuda" in out


@case
def run_takes_the_openai_sampling_options():
    common = ["run", "--model", SMALL, "--prompt", "Hello", "--json", "--backend", "cpu"]
    biased = last_json(run(*common, "--max-tokens", "4", "--ignore-eos", "--logit-bias", "634=100",
                           check_exit=0).stdout)
    assert biased["tokens"] == [634] * 4, biased
    eos = json.load(open(os.path.join(SMALL, "config.json")))["eos_token_id"]
    held = last_json(run(*common, "--max-tokens", "8", "--logit-bias", f"{eos}=100", "--min-tokens", "2",
                         check_exit=0).stdout)
    assert len(held["tokens"]) == 3 and held["tokens"][2] == eos and held["finish_reason"] == "stop", held
    plain = last_json(run(*common, "--max-tokens", "12", "--ignore-eos", check_exit=0).stdout)["tokens"]
    penalized = last_json(run(*common, "--max-tokens", "12", "--ignore-eos", "--presence-penalty", "2",
                              "--frequency-penalty", "1", "--repetition-penalty", "1.2", check_exit=0).stdout)["tokens"]
    assert len(penalized) == 12 and penalized != plain
    sampled = [*common, "--max-tokens", "16", "--ignore-eos", "--temperature", "1"]
    fresh = [last_json(run(*sampled, check_exit=0).stdout)["tokens"] for _ in range(2)]
    assert fresh[0] != fresh[1], "without --seed each run draws a fresh seed"
    for bad in (["--presence-penalty", "2.5"], ["--frequency-penalty", "-3"], ["--logit-bias", "5"],
                ["--logit-bias", "5=101"], ["--logit-bias", "x=1"], ["--min-tokens", "-1"]):
        assert run(*common, *bad).returncode == 2, bad
    p = run(*common, "--max-tokens", "2", "--min-tokens", "3")
    assert p.returncode == 1 and b"min_tokens 3 is more than max_tokens 2" in p.stderr, p.stderr
    p = run(*common, "--logit-bias", "999999=1")
    assert p.returncode == 1 and b"logit_bias[0]: token 999999" in p.stderr, p.stderr


def cached_run(model, cache, *extra, env=None):
    """kite run --json of model with --weight-cache cache: (tokens, stderr)."""
    p = run("run", "--model", model, "--prompt-ids", "39,301,385", "--max-tokens", "8", "--backend", "cpu",
            "--threads", "2", "--json", "--weight-cache", cache, *extra, check_exit=0, env=env)
    return last_json(p.stdout)["tokens"], p.stderr.decode()


@case
def weight_cache_runs_to_the_same_tokens():
    with tempfile.TemporaryDirectory() as tmp:
        fp8 = os.path.join(tmp, "tiny-vocab1k-fp8")  # Qwen's FP8 layout, made by the repository's script
        subprocess.run([sys.executable, os.path.join(DATA, "tools", "make_fp8_checkpoint.py"),
                        SMALL, fp8], check=True, capture_output=True, timeout=300)
        cache = os.path.join(tmp, "cache")
        for model, weights in [(SMALL, "bf16"), (SMALL, "fp8"),
                               (fp8, "fp8"), (fp8, "bf16")]:
            plain, err = cached_run(model, "off", "--weights", weights)
            assert "from the checkpoint" in err and "filled" not in err, err
            first, err = cached_run(model, cache, "--weights", weights)
            assert "from the checkpoint" in err and "weight cache filled" in err, err
            second, err = cached_run(model, cache, "--weights", weights)
            assert "from the weight cache" in err and "rebuild" not in err, err
            assert plain == first == second, (model, weights, plain, first, second)
        listing = run("cache", "list", "--weight-cache", cache, check_exit=0).stdout.decode().splitlines()
        assert len(listing) == 4, listing
        assert any(os.path.realpath(fp8) in line and "  fp8  cpu/" in line for line in listing), listing
        # a flipped byte in an entry: one line saying so, rebuilt, the same tokens
        entry = sorted(os.path.join(cache, f) for f in os.listdir(cache) if f.endswith(".kwc"))[0]
        with open(entry, "r+b") as f:
            f.seek(-3, os.SEEK_END)
            byte = f.read(1)
            f.seek(-3, os.SEEK_END)
            f.write(bytes([byte[0] ^ 0xFF]))
        for line in listing:
            if line.endswith(entry):
                model, weights = line.split("  ")[0], line.split("  ")[1]
        tokens, err = cached_run(model, cache, "--weights", weights)
        rebuilt = [line for line in err.splitlines() if "rebuilding it from the checkpoint" in line]
        assert len(rebuilt) == 1 and entry in rebuilt[0] and "checksum" in rebuilt[0], err
        assert tokens == cached_run(model, "off", "--weights", weights)[0]
        assert run("cache", "clear", "--weight-cache", cache, check_exit=0).stdout == b"removed 4 files\n"
        assert run("cache", "list", "--weight-cache", cache, check_exit=0).stdout == b""
        assert run("cache", "frobnicate", "--weight-cache", cache).returncode == 2
        assert run("cache").returncode == 2


@case
def weight_cache_default_folder_and_an_unusable_one():
    with tempfile.TemporaryDirectory() as tmp:
        model = SMALL
        env = {"XDG_CACHE_HOME": tmp}
        p = run("run", "--model", model, "--prompt-ids", "1,2", "--max-tokens", "2", "--backend", "cpu", env=env,
                check_exit=0)
        assert len([f for f in os.listdir(os.path.join(tmp, "kite")) if f.endswith(".kwc")]) == 1
        listing = run("cache", "list", env=env, check_exit=0).stdout.decode()
        assert os.path.realpath(model) in listing and "bf16  cpu/" in listing, listing
        # a default folder that cannot be made: one warning line, and the run goes on uncached
        blocker = os.path.join(tmp, "a-file")
        open(blocker, "w").close()
        p = run("run", "--model", model, "--prompt-ids", "1,2", "--max-tokens", "2", "--backend", "cpu",
                env={"XDG_CACHE_HOME": blocker}, check_exit=0)
        warnings = [line for line in p.stderr.decode().splitlines() if "without the weight cache" in line]
        assert len(warnings) == 1 and blocker in warnings[0], p.stderr
        assert run("cache", "clear", env=env, check_exit=0).stdout == b"removed 1 file\n"


finish()

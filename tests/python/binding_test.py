#!/usr/bin/env python3
"""The Python binding (python/kite) on the tiny checkpoints of tests/data, against the transformers
references there and against itself: tokenizer round trip, greedy tokens and logprobs, a batch equal to
its requests run alone, streaming equal to the whole, stop strings, and errors raised as KiteError."""
import argparse, json, os, sys

ap = argparse.ArgumentParser()
ap.add_argument("--library", required=True)
ap.add_argument("--data", required=True)
ap.add_argument("--python-dir", required=True)
args = ap.parse_args()
sys.path.insert(0, args.python_dir)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from cases import case, finish  # noqa: E402
import kite  # noqa: E402

DATA = args.data
kite.load_library(args.library)
REF = {name: json.load(open(os.path.join(DATA, name + ".reference.json"))) for name in ("tiny", "tiny-untied")}


def model(name="tiny"):
    return kite.Model(os.path.join(DATA, name), backend="cpu", threads=2, library=args.library)


@case
def info_describes_the_checkpoint():
    with model() as m:
        assert m.info["backend"] == "cpu", m.info
        assert m.info["has_tokenizer"] and m.info["n_layers"] > 0 and m.info["vocab_size"] > 151000, m.info


@case
def tokenizer_round_trip_matches_transformers():
    with model() as m:
        for r in REF["tiny"]["results"]:
            assert m.tokenize(r["prompt"]) == r["prompt_ids"], r["prompt"]
            assert m.detokenize(r["prompt_ids"]) == r["prompt"]
        assert m.tokenize("") == [] and m.detokenize([]) == ""


@case
def greedy_tokens_and_logprobs_match_transformers():
    for name in ("tiny", "tiny-untied"):
        with model(name) as m:
            for r in REF[name]["results"]:
                out = m.generate(r["prompt_ids"], max_tokens=len(r["greedy"]), ignore_eos=True, logprobs=5)
                assert out.tokens == r["greedy"], (name, r["prompt"][:20], out.tokens, r["greedy"])
                assert out.finish_reason == "length"
                for got, want in zip(out.logprobs, r["steps"]):
                    assert [i for i, _ in got.top] == want["top_ids"], (got.top, want["top_ids"])
                    for (_, a), b in zip(got.top, want["top_logprobs"]):
                        assert abs(a - b) <= 1e-4, (a, b)


@case
def a_batch_equals_its_requests_alone():
    with model() as m:
        prompts = [r["prompt_ids"] for r in REF["tiny"]["results"]]
        alone = [m.generate(p, max_tokens=12, ignore_eos=True).tokens for p in prompts]
        together = [c.tokens for c in m.generate_batch(prompts, max_tokens=12, ignore_eos=True)]
        assert together == alone, (together, alone)
        assert m.engine_stats()["kv_blocks_free"] == m.engine_stats()["kv_blocks_total"]


@case
def stream_equals_generate_and_sampling_is_seeded():
    with model() as m:
        options = dict(max_tokens=20, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
        whole = m.generate("The capital of France is", **options)
        pieces = list(m.stream("The capital of France is", **options))
        assert "".join(pieces) == whole.text, (pieces, whole.text)
        assert m.generate("The capital of France is", **options).tokens == whole.tokens


@case
def greedy_generation_runs_ahead():
    # the engine's overlapped decode (kite_engine_stats.steps_ahead): the stats struct carries the field
    with model() as m:
        out = m.generate("The capital of France is", max_tokens=16, ignore_eos=True)
        stats = m.engine_stats()
        assert len(out.tokens) == 16 and stats["steps_ahead"] > 0, stats


@case
def an_abandoned_stream_is_cancelled():
    with model() as m:
        stream = m.stream("The capital of France is", max_tokens=50, ignore_eos=True)
        next(iter(stream), None)
        stream.close()
        stats = m.engine_stats()
        assert stats["running"] == 0 and stats["waiting"] == 0 and stats["kv_blocks_free"] == stats["kv_blocks_total"], stats


@case
def stop_strings_end_the_text_before_them():
    with model() as m:
        full = m.generate("The capital of France is", max_tokens=24, ignore_eos=True)
        assert len(full.text) > 4, full.text
        stop = full.text[len(full.text) // 2:][:3]
        cut = m.generate("The capital of France is", max_tokens=24, ignore_eos=True, stop=[stop])
        assert cut.finish_reason == "stop" and stop not in cut.text and full.text.startswith(cut.text), (cut, stop)


@case
def chat_renders_as_transformers_and_answers():
    chat = os.path.join(DATA, "chat")
    with model() as m:
        for name, thinking in (("03-multi-turn-system", True), ("18-enable-thinking-false", False),
                               ("41-several-tool-calls", True)):
            body = json.load(open(os.path.join(chat, "conversations", name + ".json"), encoding="utf-8"))
            golden = open(os.path.join(chat, "goldens", "qwen3", name + ".txt"), "rb").read().decode("utf-8")
            text = m.render_chat(body["messages"], body.get("tools"), enable_thinking=thinking,
                                 add_generation_prompt=body.get("add_generation_prompt", True))
            assert text == golden, (name, text[-80:], golden[-80:])
        messages = [{"role": "user", "content": "Hello there"}]
        options = dict(max_tokens=12, temperature=0.8, seed=5)
        whole = m.chat(messages, **options)
        assert whole.finish_reason in ("length", "stop") and whole.prompt.endswith("<|im_start|>assistant\n"), whole
        pieces = list(m.chat(messages, stream=True, **options))
        assert "".join(d.content for d in pieces) == whole.content, (pieces, whole)
        assert "".join(d.reasoning for d in pieces) == whole.reasoning
        assert pieces[-1].finish_reason == whole.finish_reason
        assert m.chat(messages, **options) == whole  # the same seed, the same answer
        off = m.chat(messages, enable_thinking=False, max_tokens=4, seed=1)
        assert off.reasoning == "" and "<think>\n\n</think>" in off.prompt, off
        for bad, needle in ((lambda: m.chat([]), "messages"), (lambda: m.chat(messages, temperature=-1), "temperature"),
                            (lambda: m.chat(messages, colour=1), "colour")):
            try:
                bad()
                raise AssertionError("no error for " + needle)
            except kite.KiteError as e:
                assert needle in str(e), (needle, str(e))
        stats = m.engine_stats()
        assert stats["running"] == 0 and stats["kv_blocks_free"] == stats["kv_blocks_total"], stats


@case
def errors_raise_kite_error_with_kites_message():
    for call, needle in [
        (lambda: kite.Model(os.path.join(DATA, "does-not-exist"), backend="cpu", library=args.library), "does-not-exist"),
        (lambda: kite.Model(os.path.join(DATA, "tiny"), backend="tpu", library=args.library), "tpu"),
        (lambda: kite.Model(dummy="no-such-shape", backend="cpu", library=args.library), "no-such-shape"),
    ]:
        try:
            call()
        except kite.KiteError as e:
            assert needle in str(e), str(e)
        else:
            raise AssertionError("no KiteError for " + needle)
    with model() as m:
        try:
            m.generate("x", logprobs=21)
        except kite.KiteError as e:
            assert "logprobs" in str(e)
        else:
            raise AssertionError("logprobs=21 accepted")
    with kite.Model(dummy="tiny", backend="cpu", library=args.library) as m:
        assert not m.info["has_tokenizer"]
        try:
            m.tokenize("hello")
        except kite.KiteError:
            pass
        else:
            raise AssertionError("a model without a tokenizer tokenized")
        assert len(m.generate([1, 2, 3], max_tokens=4, ignore_eos=True).tokens) == 4


finish()

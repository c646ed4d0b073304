#!/usr/bin/env python3
"""The Python binding (python/kite) on the tiny checkpoints of tests/data, against the transformers
references there (tiny, tiny-untied) and against itself (tiny-vocab1k, whose 1,024-id vocabulary makes a token
cheap): tokenizer round trip, greedy tokens and logprobs, a batch equal to
its requests run alone, streaming equal to the whole, stop strings, and errors raised as KiteError; streams that
outlive their model, one model shared by threads, and arguments that ctypes would wrap or cut refused."""
import argparse, gc, json, os, sys, tempfile, threading, time

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


SMALL = os.path.join(DATA, "tiny-vocab1k")


def model(name="tiny-vocab1k"):
    return kite.Model(os.path.join(DATA, name), backend="cpu", threads=2, library=args.library)


with model() as m:  # the reference prompts in tiny-vocab1k's ids
    SMALL_PROMPTS = [m.tokenize(r["prompt"]) for r in REF["tiny"]["results"]]


@case
def info_describes_the_checkpoint():
    with model("tiny") as m:
        assert m.info["backend"] == "cpu", m.info
        assert m.info["has_tokenizer"] and m.info["n_layers"] > 0 and m.info["vocab_size"] > 151000, m.info


@case
def tokenizer_round_trip_matches_transformers():
    with model("tiny") as m:
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
def fp8_weights_from_the_script_equal_fp8_at_load():
    # make_fp8_checkpoint.py (pure Python) writes a whole FP8 checkpoint with kite's quantization, so it runs
    # to the tokens and logprobs of weights="fp8" on its source; "bf16" and "fp8" on the source differ.
    import subprocess, tempfile
    script = os.path.join(DATA, "tools", "make_fp8_checkpoint.py")
    prompt = REF["tiny-untied"]["results"][0]["prompt_ids"]
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, script, os.path.join(DATA, "tiny-untied"), out], check=True)
        runs = {}
        for key, path, weights in (("fp8 checkpoint", out, "fp8"), ("fp8 at load", os.path.join(DATA, "tiny-untied"), "fp8"),
                                   ("bf16", os.path.join(DATA, "tiny-untied"), "bf16")):
            with kite.Model(path, backend="cpu", threads=2, weights=weights, library=args.library) as m:
                runs[key] = m.generate(prompt, max_tokens=8, ignore_eos=True, logprobs=5)
    a, b, c = runs["fp8 checkpoint"], runs["fp8 at load"], runs["bf16"]
    assert a.tokens == b.tokens, (a.tokens, b.tokens)
    assert [x.top for x in a.logprobs] == [x.top for x in b.logprobs]
    assert [x.top for x in b.logprobs] != [x.top for x in c.logprobs]
    try:
        kite.Model(os.path.join(DATA, "tiny"), backend="cpu", weights="int4", library=args.library)
    except kite.KiteError as e:
        assert "weights" in str(e) and "int4" in str(e), str(e)
    else:
        raise AssertionError("weights='int4' accepted")


@case
def kv_cache_dtype_reaches_the_library():
    # An fp8 KV cache changes the logprobs (the field lands in kite_load_params, not in a neighbour's place), the
    # same fp8 run repeats exactly, and a dtype that is neither bf16 nor fp8 is refused.
    prompt = SMALL_PROMPTS[2]
    runs = {}
    for key, dtype in (("bf16", "bf16"), ("fp8", "fp8"), ("fp8 again", "fp8")):
        with kite.Model(SMALL, backend="cpu", threads=2, kv_cache_dtype=dtype, max_context=512,
                        library=args.library) as m:
            runs[key] = [x.top for x in m.generate(prompt, max_tokens=4, ignore_eos=True, logprobs=5).logprobs]
            assert m.info["max_context"] == 512, m.info  # the field after kv_cache_dtype is read in its place
    assert runs["fp8"] == runs["fp8 again"]
    assert runs["fp8"] != runs["bf16"]
    try:
        kite.Model(SMALL, backend="cpu", kv_cache_dtype="int4", library=args.library)
    except kite.KiteError as e:
        assert "kv_cache_dtype" in str(e) and "int4" in str(e), str(e)
    else:
        raise AssertionError("kv_cache_dtype='int4' accepted")


@case
def a_batch_equals_its_requests_alone():
    with model() as m:
        prompts = SMALL_PROMPTS
        alone = [m.generate(p, max_tokens=12, ignore_eos=True).tokens for p in prompts]
        together = [c.tokens for c in m.generate_batch(prompts, max_tokens=12, ignore_eos=True)]
        assert together == alone, (together, alone)
        assert m.engine_stats()["kv_blocks_free"] == m.engine_stats()["kv_blocks_total"]


@case
def prefix_cache_is_on_by_default_and_can_be_turned_off():
    # kite_engine_params.prefix_cache and the stats that count it: the same tokens with the cache and without
    prompt = list(range(700, 1000))  # two full blocks of 128 before the last token
    with model() as m:
        assert m.engine_stats()["prefix_cache"] is True
    results = {}
    for prefix_cache in (True, False):
        with kite.Model(SMALL, backend="cpu", threads=2, library=args.library, prefix_cache=prefix_cache) as m:
            first = m.generate(prompt, max_tokens=6, ignore_eos=True).tokens
            second = m.generate(prompt, max_tokens=6, ignore_eos=True).tokens
            stats = m.engine_stats()
            assert first == second and stats["prefix_cache"] is prefix_cache, stats
            assert stats["kv_blocks_free"] == stats["kv_blocks_total"], stats
            hits = stats["prefix_cache_hit_tokens"]
            assert hits == (256 if prefix_cache else 0), stats
            assert (stats["kv_blocks_cached"] > 0) == prefix_cache, stats
            results[prefix_cache] = first
    assert results[True] == results[False], results
    try:
        kite.Model(SMALL, backend="cpu", library=args.library, prefix_cache=1)
    except kite.KiteError as e:
        assert "prefix_cache must be True or False" in str(e), str(e)
    else:
        raise AssertionError("prefix_cache=1 accepted")


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
    with model("tiny") as m:
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
    with kite.Model(dummy="tiny-vocab1k", backend="cpu", library=args.library) as m:
        assert not m.info["has_tokenizer"]
        try:
            m.tokenize("hello")
        except kite.KiteError:
            pass
        else:
            raise AssertionError("a model without a tokenizer tokenized")
        assert len(m.generate([1, 2, 3], max_tokens=4, ignore_eos=True).tokens) == 4



def raises(call, *needles):
    """call() raises KiteError whose message holds every needle."""
    try:
        call()
    except kite.KiteError as e:
        for needle in needles:
            assert needle in str(e), (needles, str(e))
        return str(e)
    raise AssertionError(f"no KiteError (wanted {needles})")


PROMPT = "The capital of France is"


@case
def a_stream_that_outlives_close_raises_and_frees_nothing_twice():
    # the use after free: the generator's cleanup called kite_engine_cancel on the freed engine
    with model() as m:
        g = m.stream("hi", max_tokens=20)
        next(g)
    raises(lambda: next(g), "the model is closed")
    del g  # its finally sees the closed model and leaves the freed engine alone
    with model() as m:
        g = m.stream("hi", max_tokens=20)
        next(g)
    g.close()
    with model() as m:
        g = m.stream("hi", max_tokens=20)  # never started
    raises(lambda: next(g), "the model is closed")
    with model() as m:
        c = m.chat([{"role": "user", "content": "Hello"}], stream=True, max_tokens=20, seed=1)
        next(c)
    raises(lambda: next(c), "the model is closed")
    del c
    m.close()  # twice is fine
    for call in (lambda: m.generate("x"), lambda: m.tokenize("x"), lambda: m.detokenize([1]),
                 lambda: m.engine_stats(), lambda: m.render_chat([{"role": "user", "content": "x"}]),
                 lambda: list(m.stream("x"))):
        raises(call, "the model is closed")
    assert m.closed


@case
def a_stream_keeps_its_model_alive():
    with model() as m:
        want = m.generate(PROMPT, max_tokens=16, ignore_eos=True).text
    m = model()
    g = m.stream(PROMPT, max_tokens=16, ignore_eos=True)
    first = next(g)
    del m
    gc.collect()
    assert first + "".join(g) == want


@case
def two_streams_on_one_model_interleave():
    with model() as m:
        a_options = dict(max_tokens=14, ignore_eos=True)
        b_options = dict(max_tokens=20, temperature=0.8, seed=3, ignore_eos=True)
        a_want, b_want = m.generate(PROMPT, **a_options).text, m.generate("Once upon a time", **b_options).text
        a, b = m.stream(PROMPT, **a_options), m.stream("Once upon a time", **b_options)
        a_got, b_got = [], []
        for x, y in zip(a, b):
            a_got.append(x)
            b_got.append(y)
        a_got += list(a)
        b_got += list(b)
        assert ("".join(a_got), "".join(b_got)) == (a_want, b_want), (a_got, b_got)
        stats = m.engine_stats()
        assert stats["running"] == 0 and stats["kv_blocks_free"] == stats["kv_blocks_total"], stats


def run_threads(targets):
    errors = []

    def wrap(target):
        def body():
            try:
                target()
            except BaseException as e:  # noqa: B902 (reported below)
                errors.append(e)
        return body
    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
        assert not t.is_alive(), "a thread hung"
    if errors:
        raise errors[0]


@case
def threads_sharing_a_model_get_their_solo_tokens():
    # the case: two threads calling generate on one Model failed, then crashed
    prompts = SMALL_PROMPTS
    options = [dict(max_tokens=10, ignore_eos=True), dict(max_tokens=12, temperature=0.9, seed=11, ignore_eos=True)]
    with model() as m:
        alone = {(i, j): m.generate(p, **o).tokens for i, p in enumerate(prompts) for j, o in enumerate(options)}
        got = {}

        def worker(j):
            def body():
                for _ in range(3):
                    for i, p in enumerate(prompts):
                        tokens = m.generate(p, **options[j]).tokens
                        assert got.setdefault((i, j), tokens) == tokens
                    assert [c.tokens for c in m.generate_batch(prompts, **options[j])] == \
                        [alone[i, j] for i in range(len(prompts))]
            return body
        run_threads([worker(0), worker(1), worker(0), worker(1)])
        assert got == alone, (got, alone)
        stats = m.engine_stats()
        assert stats["running"] == 0 and stats["waiting"] == 0 and stats["kv_blocks_free"] == stats["kv_blocks_total"]


@case
def a_stream_and_a_generate_from_another_thread():
    with model() as m:
        stream_options = dict(max_tokens=30, temperature=0.7, seed=2, ignore_eos=True)
        want_stream = m.generate(PROMPT, **stream_options).text
        want_generate = m.generate("Once upon a time", max_tokens=25, ignore_eos=True).tokens
        streamed, generated = [], []

        def streamer():
            for piece in m.stream(PROMPT, **stream_options):
                streamed.append(piece)
                time.sleep(0.001)

        def generator():
            for _ in range(4):
                generated.append(m.generate("Once upon a time", max_tokens=25, ignore_eos=True).tokens)
        run_threads([streamer, generator])
        assert "".join(streamed) == want_stream, (streamed, want_stream)
        assert generated == [want_generate] * 4, generated
        chats = []
        messages = [{"role": "user", "content": "Hello there"}]
        want_chat = m.chat(messages, max_tokens=12, seed=5)
        run_threads([lambda: chats.append(m.chat(messages, max_tokens=12, seed=5)),
                     lambda: chats.append(list(m.chat(messages, stream=True, max_tokens=12, seed=5))),
                     lambda: m.generate(PROMPT, max_tokens=20)])
        whole = next(c for c in chats if isinstance(c, kite.ChatCompletion))
        pieces = next(c for c in chats if isinstance(c, list))
        assert whole == want_chat and "".join(d.content for d in pieces) == want_chat.content, (chats, want_chat)


@case
def close_while_another_thread_streams_is_a_clean_error():
    # suspended: the other thread resumes its stream after close()
    m = model()
    first, closed, outcome = threading.Event(), threading.Event(), []

    def streamer():
        try:
            for _ in m.stream(PROMPT, max_tokens=200, ignore_eos=True):
                first.set()
                closed.wait(60)
            outcome.append("finished")
        except kite.KiteError as e:
            outcome.append(str(e))
    t = threading.Thread(target=streamer)
    t.start()
    assert first.wait(60)
    m.close()
    closed.set()
    t.join(60)
    assert outcome == ["kite: the model is closed"], outcome
    # racing: close() waits for the step in progress, the stream then fails or has finished
    for attempt in range(6):
        m = model()
        started, outcome = threading.Event(), []

        def racer():
            try:
                for _ in m.stream(PROMPT, max_tokens=300, ignore_eos=True):
                    started.set()
                outcome.append("finished")
            except kite.KiteError as e:
                outcome.append(str(e))
        t = threading.Thread(target=racer)
        t.start()
        assert started.wait(60)
        time.sleep(0.002 * attempt)
        m.close()
        t.join(60)
        assert outcome in (["finished"], ["kite: the model is closed"]), outcome


@case
def a_stream_collected_inside_a_callback_is_cancelled_after_the_step():
    # A garbage collection inside the engine's callback finalizes an abandoned stream: its cancel must wait for
    # the step in progress instead of re-entering the engine. The callback builds a kite.TokenLogprob per
    # token (logprobs=1): here that collects garbage first.
    real = kite.TokenLogprob

    def collecting(*fields):
        gc.collect()
        return real(*fields)
    with model() as m:
        want = m.generate("Once upon a time", max_tokens=24, ignore_eos=True, logprobs=1)
        try:
            for _ in range(3):
                g = m.stream(PROMPT, max_tokens=200, ignore_eos=True)
                next(g)
                cycle = [g]
                cycle.append(cycle)  # only the cycle collector frees it
                del g, cycle
                kite.TokenLogprob = collecting
                got = m.generate("Once upon a time", max_tokens=24, ignore_eos=True, logprobs=1)
                kite.TokenLogprob = real
                assert got == want, (got.tokens, want.tokens)
        finally:
            kite.TokenLogprob = real
        stats = m.engine_stats()
        assert stats["running"] == 0 and stats["waiting"] == 0 and stats["kv_blocks_free"] == stats["kv_blocks_total"], stats


@case
def integers_past_their_c_type_are_refused():
    # the case: max_tokens=2**32+2 was wrapped to 2 tokens by ctypes
    with model() as m:
        for options, needle in [
            (dict(max_tokens=2**32 + 2), "max_tokens"), (dict(max_tokens=-1), "max_tokens"),
            (dict(max_tokens=True), "max_tokens"), (dict(max_tokens=4.0), "max_tokens"),
            (dict(max_tokens="4"), "max_tokens"), (dict(top_k=2**31), "top_k"), (dict(top_k=1.5), "top_k"),
            (dict(seed=-1), "seed"), (dict(seed=2**64), "seed"), (dict(seed=1.0), "seed"),
            (dict(logprobs=True), "logprobs"), (dict(logprobs=2**32 + 1), "logprobs"),
            (dict(temperature=True), "temperature"), (dict(temperature=float("nan")), "temperature"),
            (dict(temperature=float("inf")), "temperature"), (dict(top_p=1e39), "top_p"),
            (dict(min_p=10**400), "min_p"), (dict(temperature="0.5"), "temperature"),
            (dict(repetition_penalty=None), "repetition_penalty"), (dict(ignore_eos=1), "ignore_eos"),
            (dict(ignore_eos="no"), "ignore_eos"),
        ]:
            raises(lambda: m.generate(PROMPT, **options), needle)
            raises(lambda: m.stream(PROMPT, **options), needle)  # checked when the stream is made
        for prompt, needle in [([1, 2**32 + 1], "prompt[1]"), ([1, -1], "prompt[1]"), ([1.0], "prompt[0]"),
                               ([True], "prompt[0]"), ([1, "2"], "prompt[1]"), (b"hi", "bytes"), ({1, 2}, "set"),
                               (7, "int")]:
            raises(lambda: m.generate(prompt, max_tokens=1), needle)
        raises(lambda: m.generate_batch("ab", max_tokens=1), "prompts")
        raises(lambda: m.detokenize([2**32]), "ids[0]")
        raises(lambda: m.detokenize("ab"), "ids")
        raises(lambda: m.tokenize(b"x"), "text")
        assert len(m.generate(PROMPT, max_tokens=3, ignore_eos=True, seed=2**64 - 1, temperature=1).tokens) == 3
        messages = [{"role": "user", "content": "Hi"}]
        for options, needle in [(dict(max_tokens=2**32 + 2), "max_tokens"), (dict(seed=-1), "seed"),
                                (dict(top_k=True), "top_k"), (dict(temperature=float("nan")), "temperature"),
                                (dict(stream="yes"), "stream"), (dict(enable_thinking="false"), "enable_thinking")]:
            raises(lambda: m.chat(messages, **options), needle)
        raises(lambda: m.render_chat(messages, add_generation_prompt=1), "add_generation_prompt")
        raises(lambda: m.chat("hello"), "messages")
    for kwargs, needle in [(dict(threads=2**32 + 2), "threads"), (dict(threads=-1), "threads"),
                           (dict(threads=2.0), "threads"), (dict(device=-1), "device"),
                           (dict(kv_cache_mb=-1), "kv_cache_mb"), (dict(kv_cache_mb=2**60), "kv_cache_mb"),
                           (dict(kv_cache_mb=1.5), "kv_cache_mb"), (dict(max_context=2**31), "max_context"),
                           (dict(max_sequences=-1), "max_sequences"), (dict(max_sequences=True), "max_sequences")]:
        raises(lambda: kite.Model(SMALL, backend="cpu", library=args.library, **kwargs), needle)
    raises(lambda: kite.Model(dummy="tiny", seed=-1, backend="cpu", library=args.library), "seed")
    raises(lambda: kite.Model(dummy="tiny\0x", backend="cpu", library=args.library), "dummy", "NUL")
    raises(lambda: kite.Model(SMALL + "\0/elsewhere", backend="cpu", library=args.library), "NUL")
    with kite.Model(SMALL, backend="cpu", threads=2, library=args.library, kv_cache_mb=64, max_context=256,
                    max_sequences=4) as m:
        stats = m.engine_stats()
        assert stats["max_context"] == 256, stats


@case
def rope_scaling_matches_transformers_yarn():
    # tests/data/yarn/tiny-yarn: transformers on tiny with this rope scaling in config.json
    ref = json.load(open(os.path.join(DATA, "yarn", "tiny-yarn.reference.json")))
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
    for given in (scaling, json.dumps(scaling)):
        with kite.Model(os.path.join(DATA, "tiny"), backend="cpu", threads=2, library=args.library,
                        rope_scaling=given) as m:
            assert m.info["max_context"] == 4096, m.info
            r = ref["results"][0]
            out = m.generate(r["prompt_ids"], max_tokens=len(r["greedy"]), ignore_eos=True, logprobs=5)
            assert out.tokens == r["greedy"], (out.tokens, r["greedy"])
            for got, want in zip(out.logprobs, r["steps"]):
                for (_, a), b in zip(got.top, want["top_logprobs"]):
                    assert abs(a - b) <= 1e-4, (a, b)
    tiny = os.path.join(DATA, "tiny")
    raises(lambda: kite.Model(tiny, backend="cpu", library=args.library, rope_scaling={"rope_type": "llama3"}),
           'rope_scaling.rope_type is "llama3"', "--rope-scaling")
    raises(lambda: kite.Model(tiny, backend="cpu", library=args.library, rope_scaling=4), "rope_scaling")
    raises(lambda: kite.Model(tiny, backend="cpu", library=args.library, rope_scaling="{\"rope_type\"\0"), "NUL")


@case
def a_prompt_past_the_context_limit_raises():
    with kite.Model(SMALL, backend="cpu", threads=2, library=args.library, max_context=8) as m:
        assert m.info["max_context"] == 8 and m.engine_stats()["max_context"] == 8
        message = raises(lambda: m.generate(list(range(100, 108)), max_tokens=2), "the prompt has 8 tokens",
                         "context limit is 8", "--max-context", "--rope-scaling")
        assert "up to the model's 4096" in message, message
        out = m.generate(list(range(100, 107)), max_tokens=4)  # the limit minus one: one token
        assert len(out.tokens) == 1 and out.finish_reason == "length", out
    raises(lambda: kite.Model(SMALL, backend="cpu", library=args.library, max_context=4097),
           "max_context (--max-context) 4097 is above the model's context limit 4096")


@case
def a_stop_string_is_one_string_not_its_characters():
    # the case: stop="Dx" became the stop strings "D" and "x"
    with model() as m:
        full = m.generate(PROMPT, max_tokens=40, ignore_eos=True).text
        # two characters whose first one occurs earlier in the text on its own
        stop = next((full[i:i + 2] for i in range(1, len(full) - 1)
                     if full[i] in full[:i] and full[i:i + 2] not in full[:i + 1] and full[i:i + 2].strip()), None)
        assert stop, full
        cut = m.generate(PROMPT, max_tokens=40, ignore_eos=True, stop=stop)
        assert cut.finish_reason == "stop" and cut.text == full[:full.index(stop)], (stop, cut.text, full)
        assert m.generate(PROMPT, max_tokens=40, ignore_eos=True, stop=[stop]).text == cut.text
        assert "".join(m.stream(PROMPT, max_tokens=40, ignore_eos=True, stop=stop)) == cut.text
        assert m.generate(PROMPT, max_tokens=40, ignore_eos=True, stop=(stop, "\u2603\u2603")).text == cut.text
        for stop, needle in [("", "stop[0]"), ([stop, ""], "stop[1]"), (["a\0b"], "NUL"), (b"ab", "stop"),
                             ([b"ab"], "stop[0]"), ([1], "stop[0]"), (3, "stop"), ({"ab"}, "stop")]:
            raises(lambda: m.generate(PROMPT, max_tokens=4, stop=stop), needle)
            raises(lambda: m.chat([{"role": "user", "content": "Hi"}], max_tokens=4, stop=stop), needle)

@case
def openai_sampling_fields_reach_the_library():
    with model() as m:
        eos = m.info["eos_ids"][0]
        biased = m.generate(PROMPT, max_tokens=5, ignore_eos=True, logit_bias={634: 100})
        assert biased.tokens == [634] * 5, biased.tokens
        assert m.generate(PROMPT, max_tokens=5, ignore_eos=True, logit_bias={"634": 100.0}).tokens == biased.tokens
        plain = m.generate(PROMPT, max_tokens=16, ignore_eos=True)
        penalized = m.generate(PROMPT, max_tokens=16, ignore_eos=True, presence_penalty=2.0, frequency_penalty=1.0)
        assert len(penalized.tokens) == 16 and penalized.tokens != plain.tokens
        assert m.generate(PROMPT, max_tokens=8, logit_bias={eos: 100}).tokens == [eos]
        held = m.generate(PROMPT, max_tokens=8, logit_bias={eos: 100}, min_tokens=3)
        assert len(held.tokens) == 4 and eos not in held.tokens[:3] and held.tokens[3] == eos, held.tokens
        assert held.finish_reason == "stop"
        seeded = dict(max_tokens=12, temperature=1.0, ignore_eos=True)
        assert m.generate(PROMPT, seed=9, **seeded).tokens == m.generate(PROMPT, seed=9, **seeded).tokens
        assert m.generate(PROMPT, **seeded).tokens != m.generate(PROMPT, **seeded).tokens  # fresh seeds
        for options, needle in [(dict(presence_penalty=2.5), "presence_penalty"),
                                (dict(frequency_penalty=-2.5), "frequency_penalty"),
                                (dict(frequency_penalty="1"), "frequency_penalty"),
                                (dict(logit_bias={10**6: 1}), "logit_bias[0]: token 1000000"),
                                (dict(logit_bias={5: 101}), "logit_bias[0]: bias"),
                                (dict(logit_bias={"x": 1}), "logit_bias token"),
                                (dict(logit_bias=[1, 2]), "logit_bias"),
                                (dict(logit_bias={i: 1 for i in range(301)}), "logit_bias"),
                                (dict(min_tokens=-1), "min_tokens"), (dict(min_tokens=9, max_tokens=8), "min_tokens")]:
            raises(lambda: m.generate(PROMPT, **options), needle)


@case
def weight_cache_reloads_to_the_same_tokens():
    with tempfile.TemporaryDirectory() as cache:
        path = SMALL
        runs = []
        for weight_cache in ["off", cache, cache]:
            with kite.Model(path, backend="cpu", threads=2, weights="fp8", weight_cache=weight_cache,
                            library=args.library) as m:
                runs.append(m.generate(PROMPT, max_tokens=12, ignore_eos=True).tokens)
            entries = [f for f in os.listdir(cache) if f.endswith(".kwc")]
            assert len(entries) == (0 if weight_cache == "off" else 1), entries
        assert runs[0] == runs[1] == runs[2], runs
    raises(lambda: kite.Model(SMALL, backend="cpu", weight_cache=3, library=args.library),
           "weight_cache")


@case
def a_request_whose_logits_are_not_finite_raises_alone():
    """tiny-untied with a +inf in the embedding row of token 9707: a prompt holding it has NaN logits, so its call
    raises KiteError with the engine's message (a batch's after its other requests ran), and the model goes on
    working with every KV block free."""
    import poisoned_checkpoint
    healthy, poisoned = [1879, 374, 264, 1273], [poisoned_checkpoint.POISONED_TOKEN, 11, 1879]
    options = dict(max_tokens=6, ignore_eos=True)
    with model("tiny-untied") as m:
        alone = m.generate(healthy, **options)
    folder = poisoned_checkpoint.make(os.path.join(DATA, "tiny-untied"))
    try:
        with kite.Model(folder, backend="cpu", threads=2, library=args.library, weight_cache="off") as m:
            for sampled in ({}, {"temperature": 0.8, "top_k": 20, "seed": 3}, {"logprobs": 2}):
                for call in (lambda: m.generate(poisoned, **options, **sampled),
                             lambda: m.generate_batch([poisoned, healthy], **options, **sampled),
                             lambda: list(m.stream(poisoned, **options, **sampled))):
                    try:
                        call()
                        raise AssertionError("no KiteError for NaN logits (%r)" % sampled)
                    except kite.KiteError as e:
                        assert "NaN" in str(e) and "logits" in str(e), str(e)
                stats = m.engine_stats()
                assert stats["kv_blocks_free"] == stats["kv_blocks_total"], stats
            again = m.generate(healthy, **options)
            assert again.tokens == alone.tokens and again.finish_reason == alone.finish_reason, (again, alone)
    finally:
        poisoned_checkpoint.remove(folder)


finish()

#!/usr/bin/env python3
"""Peer baseline: Hugging Face transformers (bf16, sdpa attention) on a Qwen3 checkpoint, on the GPU.

Usage: peer_transformers.py CKPT [--out FILE.jsonl] [--reps 5]
Rows (JSON lines, like kite bench -o jsonl): pp256, pp2048 (one forward over a random prompt), and tg128
after a 256-token prompt for B = 1 and 8 (generate with greedy decoding, min_new_tokens = max_new_tokens,
decode time = generate time minus the prefill time of the same prompt). Median of repetitions after a
warm-up; torch.cuda.synchronize() around every timed region."""
import argparse, datetime, json, statistics, subprocess, time, torch
from transformers import AutoModelForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("ckpt")
ap.add_argument("--out", default=None)
ap.add_argument("--reps", type=int, default=5)
a = ap.parse_args()

torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(a.ckpt, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
vocab = model.config.vocab_size
gpu = torch.cuda.get_device_name(0)
try:
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
except OSError:
    commit = "unknown"
date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
rows = []


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def emit(test, batch, tok_s, extra=None):
    row = {"test": test, "batch": batch, "tok_s": round(tok_s, 1), "peer": "transformers " + __import__("transformers").__version__,
           "torch": torch.__version__, "dtype": "bfloat16", "attention": "sdpa", "gpu": gpu, "commit": commit,
           "date": date, "reps": a.reps, "model": a.ckpt}
    row.update(extra or {})
    rows.append(row)
    print(json.dumps(row), flush=True)


with torch.no_grad():
    for n in (256, 2048):
        ids = torch.randint(0, vocab, (1, n), device="cuda")
        timed(lambda: model(ids))
        times = [timed(lambda: model(ids)) for _ in range(a.reps)]
        emit(f"pp{n}", 1, n / statistics.median(times))
    for b in (1, 8):
        ids = torch.randint(0, vocab, (b, 256), device="cuda")
        gen = lambda: model.generate(ids, max_new_tokens=128, min_new_tokens=128, do_sample=False,
                                     pad_token_id=0)
        prefill = lambda: model(ids)
        timed(gen)
        gen_times = [timed(gen) for _ in range(max(1, a.reps // 2))]
        pre_times = [timed(prefill) for _ in range(a.reps)]
        decode_s = statistics.median(gen_times) - statistics.median(pre_times)
        emit("tg128", b, b * 128 / decode_s, {"depth": 256})

if a.out:
    with open(a.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")

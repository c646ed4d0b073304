#!/usr/bin/env python3
"""Hugging Face tokenizers on one thread: load time of tokenizer.json and encode throughput (MB/s) on the
benchmark text of bench/tokenizer_bench_text.py, the same documents kite's tokenizer_bench encodes.

Usage: RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false \
       python3 bench/tokenizer_hf_bench.py --tokenizer DIR/tokenizer.json --text FILE [--out results.jsonl]
Prints one JSON line per measurement (fields: test, mb_s or ms, host, commit, date, command) and appends
them to --out when given.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

# One thread, set before tokenizers is imported (Rayon reads it once).
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out")
    ap.add_argument("--host", default=platform.node())
    args = ap.parse_args()

    import tokenizers
    from tokenizers import Tokenizer

    loads = []
    for _ in range(5):
        t0 = time.perf_counter()
        tok = Tokenizer.from_file(args.tokenizer)
        loads.append((time.perf_counter() - t0) * 1e3)

    with open(args.text, "rb") as f:
        docs = [d.decode("utf-8") for d in f.read().split(b"\x00")]
    n_bytes = sum(len(d.encode("utf-8")) for d in docs)

    times, n_tokens = [], 0
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        n_tokens = 0
        for d in docs:
            n_tokens += len(tok.encode(d, add_special_tokens=False).ids)
        times.append(time.perf_counter() - t0)
    best = min(times)

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=False).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown"
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    command = " ".join(sys.argv)
    common = {"host": args.host, "commit": commit, "date": date, "command": command,
              "impl": "hf-tokenizers-%s" % tokenizers.__version__, "threads": 1}
    rows = [
        dict(test="tokenizer_load_hf", ms=round(statistics.median(loads), 2), **common),
        dict(test="tokenizer_encode_hf", mb_s=round(n_bytes / 1e6 / best, 3), bytes=n_bytes, tokens=n_tokens,
             documents=len(docs), **common),
    ]
    for r in rows:
        print(json.dumps(r))
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()

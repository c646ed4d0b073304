#!/usr/bin/env python3
"""Writes the benchmark text that bench/tokenizer_hf_bench.py and kite's tokenizer_bench both encode.

The text is the differential corpus (tests/data/tokenizer/corpus-qwen3.jsonl: prose, code, many scripts, emoji,
numbers, special tokens, random code points) shuffled with a fixed seed and repeated until it reaches --mb MB,
cut into documents of about 16 KB. Documents are separated by NUL bytes (no document contains one), so both
benchmarks encode exactly the same documents, one encode call each.

Usage: python3 bench/tokenizer_bench_text.py [--corpus PATH] [--mb 4] --out FILE
"""
import argparse
import json
import random

SEED = 7
DOC_BYTES = 16 * 1024


def load_texts(corpus_path):
    texts = []
    with open(corpus_path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if "text" in row and "\x00" not in row["text"] and row["text"]:
                texts.append(row["text"].encode("utf-8"))
    return texts


def build_documents(corpus_path, mb):
    texts = load_texts(corpus_path)
    rng = random.Random(SEED)
    target = int(mb * 1e6)
    docs, current, total = [], [], 0
    while total < target:
        order = texts[:]
        rng.shuffle(order)
        for t in order:
            current.append(t)
            size = sum(len(x) + 1 for x in current)
            if size >= DOC_BYTES:
                doc = b"\n".join(current)
                docs.append(doc)
                total += len(doc)
                current = []
                if total >= target:
                    break
    return docs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default="tests/data/tokenizer/corpus-qwen3.jsonl")
    ap.add_argument("--mb", type=float, default=4.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    docs = build_documents(args.corpus, args.mb)
    with open(args.out, "wb") as f:
        f.write(b"\x00".join(docs))
    print("bench text: %d documents, %d bytes" % (len(docs), sum(len(d) for d in docs)))


if __name__ == "__main__":
    main()

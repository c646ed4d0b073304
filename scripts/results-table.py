#!/usr/bin/env python3
"""The README's results table, made from the rows in bench/results/*.jsonl (Python standard library only).

    python3 scripts/results-table.py            # rewrite README.md between the results markers
    python3 scripts/results-table.py --check    # exit 1 if README.md is not what the rows give
    python3 scripts/results-table.py --print    # the table on stdout
    python3 scripts/results-table.py --tsv      # the same numbers for scripts/results-chart.sh

Provenance lives in the rows (commit, date, command, GPU); the table shows each cell's commit and date, and
nothing in it is typed by hand. Which kite row a cell shows: among the rows of bench/results/kite.jsonl for that
workload whose correctness gate passed, with bf16 weights and KV cache, on the default paths (a command that starts with an environment
assignment, VAR=value kite bench ..., ran under a switch and is left out), the one with the latest date, and of
rows with the same date the later line in the file. The smaller table below it (time to first token, the
tokenizer) gives the range over the repeated rows that share the latest matching row's commit.
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"

SAMPLED = {"temperature": 0.8, "top_k": 40}

# One line of the table: its label and, per engine, what a row must hold to be that workload's. "model" matches
# the first word of a row's model field (the peers' rows describe the checkpoint after it). "llama_note" says
# where llama.cpp's figure was taken differently from kite's; "chart" is the line's name in the chart (sampled lines,
# kite only, are not charted).
WORKLOADS = [
    {"label": "pp256 (prefill, tok/s)", "chart": "pp256", "key": {"model": "qwen3-0.6b-base", "test": "pp256", "batch": 1, "depth": 0},
     "llama": {"tool": "llama-bench"}},
    {"label": "pp2048", "chart": "pp2048", "key": {"model": "qwen3-0.6b-base", "test": "pp2048", "batch": 1, "depth": 0},
     "llama": {"tool": "llama-bench"}},
    {"label": "tg128 after a 256-token prompt (decode, tok/s)", "chart": "tg128 @256",
     "key": {"model": "qwen3-0.6b-base", "test": "tg128", "batch": 1, "depth": 256},
     "llama": {"tool": "llama-bench", "depth": 0}, "llama_note": "depth 0"},
    {"label": "tg128 at depth 4,096", "chart": "tg128 @4096", "key": {"model": "qwen3-0.6b-base", "test": "tg128", "batch": 1, "depth": 4096},
     "llama": {"tool": "llama-bench"}},
    {"label": "tg128 at depth 16,384", "chart": "tg128 @16384", "key": {"model": "qwen3-0.6b-base", "test": "tg128", "batch": 1, "depth": 16384},
     "llama": {"tool": "llama-bench"}},
    {"label": "tg128 sampled (temperature 0.8, top-k 40), B = 1",
     "key": {"model": "qwen3-0.6b-base", "test": "tg128", "batch": 1, "depth": 256}, "sampled": True},
    {"label": "batched decode, 256-token prompts, B = 8", "chart": "B=8",
     "key": {"model": "qwen3-0.6b-base", "test": "tg128", "batch": 8, "depth": 256},
     "llama": {"tool": "llama-batched-bench"}},
    {"label": "B = 8 sampled (temperature 0.8, top-k 40)",
     "key": {"model": "qwen3-0.6b-base", "test": "tg128", "batch": 8, "depth": 256}, "sampled": True},
    {"label": "B = 16", "chart": "B=16", "key": {"model": "qwen3-0.6b-base", "test": "tg128", "batch": 16, "depth": 256},
     "llama": {"tool": "llama-batched-bench"}},
    {"label": "B = 32", "chart": "B=32", "key": {"model": "qwen3-0.6b-base", "test": "tg128", "batch": 32, "depth": 256},
     "llama": {"tool": "llama-batched-bench"}},
    {"label": "B = 32 sampled (temperature 0.8, top-k 40)",
     "key": {"model": "qwen3-0.6b-base", "test": "tg128", "batch": 32, "depth": 256}, "sampled": True},
    {"label": "B = 64", "chart": "B=64", "key": {"model": "qwen3-0.6b-base", "test": "tg128", "batch": 64, "depth": 256},
     "llama": {"tool": "llama-batched-bench"}},
    {"label": "B = 128", "chart": "B=128", "key": {"model": "qwen3-0.6b-base", "test": "tg128", "batch": 128, "depth": 256},
     "llama": {"tool": "llama-batched-bench"}},
    {"label": "Qwen3-1.7B pp2048", "chart": "1.7B pp2048", "key": {"model": "qwen3-1.7b-base", "test": "pp2048", "batch": 1, "depth": 0},
     "llama": {"tool": "llama-bench"}},
    {"label": "Qwen3-1.7B tg128 after a 256-token prompt", "chart": "1.7B tg128",
     "key": {"model": "qwen3-1.7b-base", "test": "tg128", "batch": 1, "depth": 256},
     "llama": {"tool": "llama-bench", "depth": 0}, "llama_note": "depth 0"},
]


# Rows measured in other units, each repeated a few times in one call: a cell gives the range over the rows that
# share the commit of the latest matching row. (file, test, unit, value field[, machine prefix]) for kite and for
# its peer; the CPU rows are those of 2-core machines like CI's.
OTHER = [
    {"label": "process start to first token (0.6B checkpoint, wall clock of kite run)",
     "kite": ("first-token.jsonl", "process_start_to_first_token", "s", "seconds"), "peer": None},
    {"label": "process start to first token, 100,000-token prompt (0.6B shape with YaRN)",
     "kite": ("first-token.jsonl", "process_start_to_first_token_100k", "s", "seconds"), "peer": None},
    {"label": "tokenizer encode, one core",
     "kite": ("tokenizer.jsonl", "tokenizer_encode_kite", "MB/s", "mb_s"),
     "peer": ("tokenizer.jsonl", "tokenizer_encode_hf", "MB/s", "mb_s")},
    {"label": "tokenizer.json load",
     "kite": ("tokenizer.jsonl", "tokenizer_load_kite", "ms", "ms"),
     "peer": ("tokenizer.jsonl", "tokenizer_load_hf", "ms", "ms")},
    {"label": "CPU backend (no GPU, 2 cores like CI's), 0.6B shape: prefill of 64 tokens",
     "kite": ("cpu.jsonl", "pp64", "tok/s", "tok_s", "2-core"), "peer": None},
    {"label": "CPU backend, 0.6B shape: decode (tg8) at depth 64",
     "kite": ("cpu.jsonl", "tg8", "tok/s", "tok_s", "2-core"), "peer": None},
]

# The serving benchmark's workloads (bench/serve_bench.sh; bench/results/serve.jsonl): closed loop, greedy,
# streamed /v1/completions, 128 tokens out. A cell: output tok/s and TTFT p50 of the latest passing row.
SERVE = [
    {"label": f"random 256 in / 128 out, concurrency {c}", "key": {"dataset": "random", "input_len": 256, "concurrency": c}}
    for c in (1, 16, 64, 128)
] + [
    {"label": "shared prefix (2,048-token system prompt + 64 in) / 128 out, concurrency 32",
     "key": {"dataset": "shared-prefix", "prefix_len": 2048, "input_len": 64, "concurrency": 32}},
]
SERVERS = ("kite serve", "llama-server")


def read_rows(name):
    path = os.path.join(RESULTS, name)
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"results-table: {path}:{number}: not JSON ({e})")
    return rows


def matches(row, key):
    for field, want in key.items():
        have = row.get(field, 0 if field == "depth" else None)  # a prefill row may leave its depth out
        if field == "model":
            have = (have or "").split(" ")[0]
        if have != want:
            return False
    return True


def is_sampled(row):
    s = row.get("sampling")
    return bool(s) and all(s.get(k) == v for k, v in SAMPLED.items())


def latest_kite(rows, workload):
    """The latest row (date, then line) that passed its gate on the default paths; None if there is none."""
    best = None
    for line, row in enumerate(rows):
        if row.get("backend") != "cuda" or row.get("gate") != "pass" or row.get("tok_s") is None:
            continue
        # The table compares bf16 weights and a bf16 KV cache, as its peers run.
        if row.get("weights", "bf16") != "bf16" or row.get("kv_cache_dtype", "bf16") != "bf16":
            continue
        if not str(row.get("command", "")).startswith("kite bench"):
            continue
        if not matches(row, workload["key"]):
            continue
        if workload.get("sampled", False) != is_sampled(row):
            continue
        if row.get("sampling") and not is_sampled(row):
            continue
        order = (row.get("date", ""), line)
        if best is None or order > best[0]:
            best = (order, row)
    return best[1] if best else None


def peer_row(rows, key, extra):
    """The peer's row for the workload (the latest by date, then line, if several)."""
    want = dict(key)
    want.update(extra)
    best = None
    for line, row in enumerate(rows):
        if row.get("tok_s") is None or row.get("dtype", "bf16") not in ("bf16", "bfloat16"):
            continue
        if row.get("flash_attention") is False or not matches(row, want):
            continue
        order = (row.get("date", ""), line)
        if best is None or order > best[0]:
            best = (order, row)
    return best[1] if best else None


def collect():
    kite = read_rows("kite.jsonl")
    llama = read_rows("llama.cpp.jsonl")
    transformers = read_rows("peer-transformers.jsonl")
    table = []
    for w in WORKLOADS:
        k = latest_kite(kite, w)
        l = peer_row(llama, w["key"], w["llama"]) if "llama" in w else None
        t = None if w.get("sampled") else peer_row(transformers, w["key"], {})
        table.append((w, k, l, t))
    return table


def serve_table():
    """(workload, {server: latest passing row or None}) for each serving workload."""
    rows = read_rows("serve.jsonl") if os.path.exists(os.path.join(RESULTS, "serve.jsonl")) else []
    table = []
    for w in SERVE:
        found = {}
        for server in SERVERS:
            best = None
            for line, row in enumerate(rows):
                if row.get("server") != server or row.get("gate") != "pass" or row.get("request_rate") != "inf":
                    continue
                if not matches(row, w["key"]):
                    continue
                order = (row.get("date", ""), line)
                if best is None or order > best[0]:
                    best = (order, row)
            found[server] = best[1] if best else None
        table.append((w, found))
    return table


def serve_cell(row):
    if row is None:
        return ""
    where = " ".join(x for x in ((row.get("commit") or "")[:7], (row.get("date") or "")[:10]) if x)
    return f"{number(row['tok_s'])} tok/s, {row['ttft_ms_p50']:.1f} ms<br><sub>{where}</sub>"


def repeated(spec):
    """(low, high, count, commit, date) over the rows of the latest matching row's commit; None if no row."""
    if spec is None:
        return None
    name, test, unit, field = spec[:4]
    machine = spec[4] if len(spec) > 4 else None  # a prefix of the rows' "machine", where the row names one
    # A "baseline" row is the code before a change, measured beside it (alternating): a comparison, not the
    # current figure.
    rows = [r for r in read_rows(name) if r.get("test") == test and r.get(field) is not None
            and not r.get("baseline") and (machine is None or str(r.get("machine", "")).startswith(machine))]
    if not rows:
        return None
    latest = max(enumerate(rows), key=lambda item: (item[1].get("date", ""), item[0]))[1]
    same = [r[field] for r in rows if r.get("commit") == latest.get("commit")]
    return min(same), max(same), len(same), unit, latest


def number(v):
    return f"{v:,.0f}" if v >= 1000 or float(v).is_integer() else f"{v:,.1f}"


def cell(row, note=None):
    if row is None:
        return ""
    where = " ".join(x for x in ((row.get("commit") or "")[:7], (row.get("date") or "")[:10]) if x)
    text = number(row["tok_s"])
    if note:
        text += f" ({note})"
    return f"{text}<br><sub>{where}</sub>"


def other_cell(found):
    if found is None:
        return ""
    low, high, count, unit, row = found
    def short(v):
        return f"{v:.2f}" if v < 10 else number(v)

    text = short(low) if low == high else f"{short(low)}-{short(high)}"
    where = " ".join(x for x in ((row.get("commit") or "")[:7], (row.get("date") or "")[:10]) if x and x != "unknown")
    runs = f", {count} runs" if count > 1 else ""
    return f"{text} {unit}<br><sub>{where}{runs}</sub>"


def markdown(table):
    out = [
        "| workload (Qwen3-0.6B shape, bf16, one H200, unless named) | kite | llama.cpp | transformers |",
        "|---|---|---|---|",
    ]
    for w, k, l, t in table:
        out.append(f"| {w['label']} | {cell(k)} | {cell(l, w.get('llama_note'))} | {cell(t)} |")
    out += [
        "",
        "| other rows | kite | Hugging Face tokenizers |",
        "|---|---|---|",
    ]
    for o in OTHER:
        out.append(f"| {o['label']} | {other_cell(repeated(o['kite']))} | {other_cell(repeated(o['peer']))} |")
    out += [
        "",
        "| serving (kite serve and llama-server, one H200; output tok/s, TTFT p50) | kite serve | llama-server |",
        "|---|---|---|",
    ]
    for w, found in serve_table():
        out.append(f"| {w['label']} | {serve_cell(found['kite serve'])} | {serve_cell(found['llama-server'])} |")
    out += [
        "",
        "Made by `python3 scripts/results-table.py` from bench/results/*.jsonl; each cell gives the commit and date of",
        "its row (llama.cpp's rows record no build). kite's cell is the latest row of the workload (latest date, then",
        "latest line) whose correctness gate passed, with no environment switch in its command. llama-bench's tg128",
        "starts from an empty context; the batched rows are llama-batched-bench's S_TG with 256-token prompts. The",
        "other rows give the range over the repetitions that share the latest row's commit. The serving rows are",
        "bench/serve_bench.sh's (kite-serve-bench: closed loop, greedy, streamed /v1/completions, gated on every",
        "answer).",
    ]
    return "\n".join(out) + "\n"


def tsv(table):
    lines = ["workload\tkite\tllama.cpp\ttransformers"]
    for w, k, l, t in table:
        if w.get("sampled"):
            continue  # kite only: the chart compares engines
        values = ["-" if r is None else f"{r['tok_s']:g}" for r in (k, l, t)]  # "-": no row
        lines.append("\t".join([w["chart"]] + values))
    return "\n".join(lines) + "\n"


def splice(readme, block):
    begin, end = readme.find(BEGIN), readme.find(END)
    if begin < 0 or end < begin:
        sys.exit(f"results-table: README.md has no {BEGIN} ... {END} block")
    return readme[: begin + len(BEGIN)] + "\n" + block + readme[end:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if README.md is out of date")
    mode.add_argument("--print", action="store_true", help="print the table")
    mode.add_argument("--tsv", action="store_true", help="print the chart's data")
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    args = ap.parse_args()
    table = collect()
    for w, k, _, _ in table:
        if k is None:
            sys.exit(f"results-table: no kite row passes for '{w['label']}'")
    if args.tsv:
        sys.stdout.write(tsv(table))
        return 0
    block = markdown(table)
    if args.print:
        sys.stdout.write(block)
        return 0
    with open(args.readme, encoding="utf-8") as f:
        readme = f.read()
    updated = splice(readme, block)
    if args.check:
        if updated != readme:
            print(f"results-table: {args.readme} is out of date; run python3 scripts/results-table.py", file=sys.stderr)
            return 1
        return 0
    if updated != readme:
        with open(args.readme, "w", encoding="utf-8") as f:
            f.write(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())

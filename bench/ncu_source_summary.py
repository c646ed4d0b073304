#!/usr/bin/env python3
"""Summarises ncu's source page (warp-state sampling per SASS instruction) kernel by kernel.

Input: the CSV that `ncu -i REPORT.ncu-rep --page source --csv --print-source sass` writes for a report collected
with `--section WarpStateStats --section SourceCounters` (docs/BENCHMARKS.md, "Profiling"). For each kernel in it
this prints the number of stall samples, the reasons that took most of them, and the instructions that took at
least `share` of the kernel's samples with their top reasons: where a kernel's warps wait, and why.

usage: ncu_source_summary.py SOURCE.csv [kernel indices, e.g. 0,2] [--share 0.02] [--sass K]
  --sass K   instead, print kernel K's executed instructions: index, warp-level executions, samples, SASS
"""
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def read_kernels(path):
    """The kernels of the CSV, each {"name", "rows"}: its instructions as dicts keyed by the column header."""
    kernels, header = [], None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                kernels.append({"name": row[1] if len(row) > 1 else "?", "rows": []})
            elif row[0] == "Address":
                header = row
            elif kernels and header and len(row) == len(header):
                kernels[-1]["rows"].append(dict(zip(header, row)))
    return kernels, header


def as_int(text):
    try:
        return int(float(text))
    except ValueError:
        return 0


def summarise(kernel, header, share):
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    rows = kernel["rows"]
    total = sum(as_int(r[SAMPLES]) for r in rows)
    by_reason = collections.Counter()
    for r in rows:
        for reason in reasons:
            by_reason[reason] += as_int(r[reason])
    print(f"=== {kernel['name'][:110]}")
    print(f"    {len(rows)} instructions, {total} samples; reasons: " +
          ", ".join(f"{reason[6:]} {100 * n / max(total, 1):.0f}%" for reason, n in by_reason.most_common(6) if n))
    for index, r in enumerate(rows):
        n = as_int(r[SAMPLES])
        if total and n >= share * total:
            top = sorted(((as_int(r[reason]), reason[6:]) for reason in reasons), reverse=True)[:3]
            print(f"    {index:5d} {100 * n / total:5.1f}%  {r['Source'].strip()[:56]:56s} " +
                  " ".join(f"{name} {count}" for count, name in top if count))


def main(argv):
    args = argv[1:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    path, share, sass, which = args[0], 0.02, None, None
    i = 1
    while i < len(args):
        if args[i] == "--share" and i + 1 < len(args):
            share = float(args[i + 1])
            i += 2
        elif args[i] == "--sass" and i + 1 < len(args):
            sass = int(args[i + 1])
            i += 2
        else:
            which = [int(k) for k in args[i].split(",")]
            i += 1
    kernels, header = read_kernels(path)
    if not kernels or header is None:
        print(f"{path}: no kernels with a source table (was it written with --page source --csv?)", file=sys.stderr)
        return 1
    if sass is not None:
        if not 0 <= sass < len(kernels):
            print(f"{path}: kernel {sass} out of range (0..{len(kernels) - 1})", file=sys.stderr)
            return 1
        for index, r in enumerate(kernels[sass]["rows"]):
            if as_int(r[EXECUTED]):
                print(f"{index:5d} {as_int(r[EXECUTED]):9d} {as_int(r[SAMPLES]):5d}  {r['Source'].strip()}")
        return 0
    for k in which if which is not None else range(len(kernels)):
        if not 0 <= k < len(kernels):
            print(f"{path}: kernel {k} out of range (0..{len(kernels) - 1})", file=sys.stderr)
            return 1
        summarise(kernels[k], header, share)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

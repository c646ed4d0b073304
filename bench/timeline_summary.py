#!/usr/bin/env python3
"""Summarises a decode timeline (cuda_forward_bench --timeline, a build with cmake -DKITE_TIMELINE=ON).

Each record is one block of an instrumented kernel: when it started, when its PDL wait returned, when it ended
(the GPU's global timer, ns), its kind and a detail (src/backend/cuda/cuda_common.cuh, "Timeline"). A kernel's
blocks cannot pass their wait before the kernel before it has ended, so sorted by that time the records fall
into the step's kernels in order. First the step boundary: from the previous step's argmax to the first launch's wait
return (the publish kernel, the next graph's launch and its embedding; with cuda_forward_bench --queued no host wait).
For each kind of kernel of a layer this prints, averaged over the layers of the last whole step (microseconds):
  lead     its first block started this long before its wait returned (what ran before the wait: weights)
  release  from the previous kernel's last block end to this kernel's first wait return (the hand-over)
  span     from its first wait return to its last block end (what the chain pays after the hand-over)
  block    the median block's time from its wait return to its end, and (second line) split at the kernel's
           marks: gemv: input staged (and normalised); attention: query ready, positions folded (approximate:
           the compiler may move arithmetic across a mark)
  early    the share of its blocks that started before the previous kernel's last block ended
Then, per kernel of a layer, its blocks' median time from their wait return to their end, by how many blocks of
the next kernel had started on the same SM before they ended (does the next kernel's early traffic hold them back?),
where each kernel's blocks ran (SMs used, block time by blocks of the same launch on its SM), and the split-K
attention's folding blocks as percentiles of their start, wait return, query ready, positions folded
and end, from the kernel's first wait return (how far the last split trails the median one), and the split-K
combine's chain: the last split's fold, the last arrival counted, the combining block's (max, sum) merged, its end.
usage: timeline_summary.py FILE.bin [n_layers]
"""
import struct
import sys
from collections import namedtuple
from statistics import mean, median

# One block's record, field by field as cuda_common.cuh's timeline_record lays it out (marks: 0 = not set).
RECORD = struct.Struct("<QQQQQIIIIQQ")
Record = namedtuple("Record", "start waited mark1 mark2 end kind detail sm block mark3 mark4")
GEMV, ATTENTION, ARGMAX = 1, 2, 3
EPILOGUES = {0: "store", 1: "add", 2: "swiglu", 3: "argmax"}


def load(path):
    data = open(path, "rb").read()
    n = len(data) // RECORD.size
    return [Record._make(RECORD.unpack_from(data, i * RECORD.size)) for i in range(n)]


def kernel_name(kind, detail):
    if kind == ATTENTION:
        return "attention"
    if kind == ARGMAX:
        return "argmax"
    epilogue, cols = divmod(detail, 100000)
    return "gemv %s %d" % (EPILOGUES.get(epilogue, str(epilogue)), cols)


def split_kernels(records):
    """Consecutive records (by wait return) of one kernel name form one launch."""
    records = sorted(records, key=lambda r: r.waited)
    launches = []
    for r in records:
        name = kernel_name(r.kind, r.detail)
        if not launches or launches[-1]["name"] != name:
            launches.append({"name": name, "blocks": []})
        launches[-1]["blocks"].append(r)
    return launches


def describe(launch, previous):
    blocks = launch["blocks"]
    start = min(b.start for b in blocks)
    release = min(b.waited for b in blocks)
    end = max(b.end for b in blocks)
    d = {
        "name": launch["name"],
        "n": len(blocks),
        "start": start,
        "release_at": release,
        "end": end,
        "lead": (release - start) / 1e3,
        "span": (end - release) / 1e3,
        "block": median((b.end - b.waited) for b in blocks) / 1e3,
    }
    marked = [b for b in blocks if b.mark1]
    if marked:  # the kernel's own points (gemv: input staged; attention: query ready, positions folded)
        d["to_mark1"] = median((b.mark1 - b.waited) for b in marked) / 1e3
        last = [(b.mark2 if b.mark2 else b.mark1) for b in marked]
        d["mark1_to_mark2"] = median((l - b.mark1) for l, b in zip(last, marked)) / 1e3
        d["mark2_to_end"] = median((b.end - l) for l, b in zip(last, marked)) / 1e3
    if launch["name"] == "attention":
        combine = [b for b in blocks if b.detail == 2]
        splits = [b for b in blocks if b.detail == 1]
        if combine and splits:
            d["combine_tail"] = (max(b.end for b in combine) - max(b.end for b in splits)) / 1e3
    if previous is not None:
        d["release"] = (release - previous["end"]) / 1e3
        d["early"] = sum(1 for b in blocks if b.start < previous["end"]) / len(blocks)
    return d


def print_crowding(launches):
    """Blocks' wait-to-end times by the number of next-kernel blocks already started on their SM."""
    by_kernel = {}
    for launch, following in zip(launches, launches[1:]):
        started = {}
        for n in following["blocks"]:
            started.setdefault(n.sm, []).append(n.start)
        for b in launch["blocks"]:
            k = sum(1 for t in started.get(b.sm, []) if t < b.end)
            by_kernel.setdefault(launch["name"], {}).setdefault(k, []).append((b.end - b.waited) / 1e3)
    print("wait-to-end of a block (median us, blocks) by the next kernel's blocks started on its SM before it ended:")
    for name, by_k in by_kernel.items():
        cells = ["%d: %.2f (%d)" % (k, median(v), len(v)) for k, v in sorted(by_k.items())]
        print("  %-18s %s" % (name, "  ".join(cells)))


def print_placement(launches):
    """Where each kernel's blocks ran: SMs used per launch, and the median block (wait return to end) by how many
    blocks of the same launch shared its SM (the block scheduler fills the SMs that free up first)."""
    by_kernel = {}
    for launch in launches:
        per_sm = {}
        for b in launch["blocks"]:
            per_sm[b.sm] = per_sm.get(b.sm, 0) + 1
        k = by_kernel.setdefault(launch["name"], {"sms": [], "by_count": {}})
        k["sms"].append(len(per_sm))
        for b in launch["blocks"]:
            k["by_count"].setdefault(per_sm[b.sm], []).append((b.end - b.waited) / 1e3)
    print("placement: SMs used per launch (mean), and the median block (us, blocks) by blocks of its launch on its SM:")
    for name, k in by_kernel.items():
        cells = ["%d: %.2f (%d)" % (n, median(v), len(v)) for n, v in sorted(k["by_count"].items())]
        print("  %-18s %5.1f SMs  %s" % (name, mean(k["sms"]), "  ".join(cells)))


def print_attention_profile(launches):
    """Where the attention's blocks spend the layer: percentiles over the step's folding attention blocks of their
    start, wait return, marks, end and fold time, relative to the kernel's first wait return (us), and the medians
    of the blocks that started before and after it."""
    rows = []
    for launch in launches:
        if launch["name"] != "attention":
            continue
        blocks = [b for b in launch["blocks"] if b.mark1 and b.mark2]  # splits that folded positions
        if not blocks:
            continue
        release = min(b.waited for b in launch["blocks"])
        for b in blocks:
            rows.append([(t - release) / 1e3 for t in (b.start, b.waited, b.mark1, b.mark2, b.end)])
    if not rows:
        return
    def pct(values, q):
        values = sorted(values)
        return values[min(len(values) - 1, int(q * len(values)))]
    print("attention blocks (us from the kernel's first wait return; %d blocks over the step's layers):" % len(rows))
    print("  %-14s %7s %7s %7s %7s %7s" % ("", "p10", "p50", "p90", "p99", "max"))
    names = ("start", "waited", "query ready", "folded", "end")
    columns = [(name, [r[i] for r in rows]) for i, name in enumerate(names)]
    columns.append(("fold time", [r[3] - r[2] for r in rows]))
    for name, v in columns:
        print("  %-14s %7.2f %7.2f %7.2f %7.2f %7.2f" % (name, pct(v, .1), pct(v, .5), pct(v, .9), pct(v, .99), max(v)))
    late = [r for r in rows if r[0] > 0]
    early = [r for r in rows if r[0] <= 0]
    for label, group in (("started early", early), ("started late", late)):
        if group:
            print("  %-14s %d blocks: median start %.2f, query ready %.2f, folded %.2f, end %.2f" % (
                label, len(group), median(r[0] for r in group), median(r[2] for r in group),
                median(r[3] for r in group), median(r[4] for r in group)))


def print_combine_chain(launches):
    """The split-K attention's tail, per launch of the step, from the kernel's first wait return (us): the last
    split's positions folded (mark 2), the last arrival counted (mark 3), and per combining block (one per head
    group) its arrival, its splits' (max, sum) merged (mark 4) and its end; medians over the step's launches."""
    rows = []
    for launch in launches:
        if launch["name"] != "attention":
            continue
        folding = [b for b in launch["blocks"] if b.mark2 and b.mark3]
        combining = [b for b in folding if b.detail == 2 and b.mark4]
        if not combining:
            continue
        release = min(b.waited for b in launch["blocks"])
        last_fold = max(b.mark2 for b in folding)
        last_arrival = max(b.mark3 for b in folding)
        for b in combining:
            rows.append([(t - release) / 1e3 for t in (last_fold, last_arrival, b.mark2, b.mark3, b.mark4, b.end)])
    if not rows:
        return
    names = ("last split folded", "last arrival counted", "combiner folded", "combiner arrived",
             "combiner stats merged", "combiner end")
    print("split-K combine chain (us from the kernel's first wait return; median over %d combining blocks):" % len(rows))
    for i, name in enumerate(names):
        print("  %-22s %7.2f" % (name, median(r[i] for r in rows)))
    print("  steps: fold -> arrival %.2f, arrival -> stats merged %.2f, stats -> end %.2f" % (
        median(r[3] - r[2] for r in rows), median(r[4] - r[3] for r in rows), median(r[5] - r[4] for r in rows)))


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    records = load(sys.argv[1])
    if not records:
        print("no records")
        sys.exit(1)
    times = sorted({t for r in records for t in (r.start, r.waited, r.end)})
    steps_ns = [b - a for a, b in zip(times, times[1:]) if b > a]
    print("%d records; smallest timer step %d ns" % (len(records), min(steps_ns) if steps_ns else -1))
    launches = split_kernels(records)
    described = []
    for i, launch in enumerate(launches):
        described.append(describe(launch, described[-1] if described else None))
    # The last whole step: from the launch after the second-to-last argmax to the last argmax.
    argmax_at = [i for i, d in enumerate(described) if d["name"] == "argmax"]
    if len(argmax_at) < 2:
        print("fewer than two whole steps recorded")
        sys.exit(1)
    first, last = argmax_at[-2] + 1, argmax_at[-1]
    step = described[first:last + 1]
    step_us = (step[-1]["end"] - described[argmax_at[-2]]["end"]) / 1e3
    print("last step: %d launches, %.1f us from the previous step's argmax end to this one's" % (len(step), step_us))
    print("between steps: %.2f us from the previous step's argmax end to the first launch's wait return (publish, "
          "host or graph launch, embedding)" % step[0].get("release", float("nan")))
    kinds = {}
    for d in step[1:]:  # the first launch's release spans the embedding and the host
        kinds.setdefault(d["name"], []).append(d)
    print("%-18s %5s %8s %8s %8s %8s %6s %8s %8s" % ("kernel", "count", "blocks", "lead", "release", "span", "early",
                                                     "block", "combine"))
    total = 0.0
    for name, ds in kinds.items():
        row = (name, len(ds), mean(d["n"] for d in ds), mean(d["lead"] for d in ds),
               mean(d.get("release", 0.0) for d in ds), mean(d["span"] for d in ds),
               mean(d.get("early", 0.0) for d in ds), mean(d["block"] for d in ds))
        combine = [d["combine_tail"] for d in ds if "combine_tail" in d]
        print("%-18s %5d %8.0f %8.2f %8.2f %8.2f %6.2f %8.2f %8s" % (row + (("%.2f" % mean(combine)) if combine else "-",)))
        if all("to_mark1" in d for d in ds):
            print("%-18s median block after its wait: %.2f to mark 1, %.2f more to mark 2 (if any), %.2f to its end" % (
                "", mean(d["to_mark1"] for d in ds), mean(d["mark1_to_mark2"] for d in ds),
                mean(d["mark2_to_end"] for d in ds)))
        total += len(ds) * (row[4] + row[5])
    print("sum of release + span over the step's launches: %.1f us (the rest: embedding, publish, host)" % total)
    step_launches = launches[first:last + 1]
    print_crowding(step_launches)
    print_placement(step_launches)
    print_attention_profile(step_launches)
    print_combine_chain(step_launches)
    if len(sys.argv) > 2:
        n_layers = int(sys.argv[2])
        print("layer 1 in order:")
        layer = [d for d in step if d["name"] != "argmax"][5:10] if n_layers > 1 else []
        for d in layer:
            print("  %-16s blocks %4d lead %6.2f release %6.2f span %6.2f early %.2f block %.2f" % (
                d["name"], d["n"], d["lead"], d.get("release", 0.0), d["span"], d.get("early", 0.0), d["block"]))


if __name__ == "__main__":
    main()

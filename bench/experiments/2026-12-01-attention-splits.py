#!/usr/bin/env python3
"""The split-K attention's blocks in a decode timeline, by split index, SM and dispatch order (session 22: s22r4,
s22r8, s22r9). Run from the repository root on a timeline of a -DKITE_TIMELINE=ON build
(cuda_forward_bench --depth 16384 --queued --timeline F):
    python3 bench/experiments/2026-12-01-attention-splits.py F.16384.bin [n_splits] [chunk]
Prints: fold time (folded - query ready) against start and query ready; per SM and per split means; which split is
its head group's last; the last split's fold time with each split's mean excess removed (what evening the splits out
could give at most); start and query ready by dispatch order (blocks of 6 splits); and, for each split, how many of
its streams change cache blocks inside the loop (after the two positions loaded before the wait), next to its excess.
Assumes the grid of the 0.6B shape (8 kv heads, GROUP 2: linear block = kv_head + 8 * split) and 128-position blocks."""
import sys
from collections import defaultdict
from statistics import mean, median, pstdev

sys.path.insert(0, "bench")
from timeline_summary import load, split_kernels  # noqa: E402

KV_HEADS, STREAMS, BLOCK = 8, 16, 128


def corr(x, y):
    mx, my, sx, sy = mean(x), mean(y), pstdev(x), pstdev(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / len(x) / (sx * sy)


def main():
    path = sys.argv[1]
    n_splits = int(sys.argv[2]) if len(sys.argv) > 2 else 66
    chunk = int(sys.argv[3]) if len(sys.argv) > 3 else 249
    launches = [l for l in split_kernels(load(path)) if l["name"] == "attention"]
    rows, by_sm, by_split, last_count = [], defaultdict(list), defaultdict(list), defaultdict(int)
    for L in launches:
        blocks = [b for b in L["blocks"] if b.detail in (1, 2) and b.mark1 and b.mark2]
        t0 = min(b.waited for b in L["blocks"])
        heads = defaultdict(list)
        for b in blocks:
            split = (b.block // KV_HEADS) % n_splits
            fold = (b.mark2 - b.mark1) / 1e3
            rows.append(((b.start - t0) / 1e3, (b.mark1 - t0) / 1e3, fold, (b.mark2 - t0) / 1e3, b.block, split))
            by_sm[b.sm].append(fold)
            by_split[split].append(fold)
            heads[b.block % KV_HEADS].append(b)
        for group in heads.values():
            last_count[(max(group, key=lambda b: b.mark2).block // KV_HEADS) % n_splits] += 1
    start, ready, fold = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
    print("%d launches, %d folding blocks; fold time mean %.2f sd %.2f us" % (len(launches), len(rows), mean(fold), pstdev(fold)))
    print("corr(start, query ready) %.3f; corr(query ready, fold time) %.3f" % (corr(start, ready), corr(ready, fold)))
    sm_means = sorted(mean(v) for v in by_sm.values())
    print("per-SM mean fold time: %.2f .. %.2f (sd %.3f)" % (sm_means[0], sm_means[-1], pstdev(sm_means)))
    # How often each split is the last of its head group to fold.
    print("last split of a head group (split: count):",
          " ".join("%d:%d" % kv for kv in sorted(last_count.items(), key=lambda kv: -kv[1])[:10]))
    full = [s for s in by_split if (s + 1) * chunk <= 16384]
    grand = mean(v for s in full for v in by_split[s])
    excess = {s: (mean(by_split[s]) - grand if s in full else 0.0) for s in by_split}
    observed, evened = [], []
    for L in launches:
        t0 = min(b.waited for b in L["blocks"])
        heads = defaultdict(list)
        for b in L["blocks"]:
            if b.detail in (1, 2) and b.mark1 and b.mark2:
                heads[b.block % KV_HEADS].append(b)
        observed.append(max((b.mark2 - t0) / 1e3 for g in heads.values() for b in g))
        evened.append(max((b.mark2 - t0) / 1e3 - excess[(b.block // KV_HEADS) % n_splits] for g in heads.values() for b in g))
    print("last split folded (max over head groups): %.2f us; with each split's excess removed %.2f" % (mean(observed), mean(evened)))
    order = defaultdict(list)
    for r in rows:
        order[r[4] // (6 * KV_HEADS)].append(r)
    for k in sorted(order):
        rs = order[k]
        print("splits %2d-%2d: start %+.2f query ready %.2f folded %.2f" % (6 * k, 6 * k + 5, mean(r[0] for r in rs),
                                                                         mean(r[1] for r in rs), mean(r[3] for r in rs)))
    for s in sorted(by_split, key=lambda s: excess[s]):
        begin = s * chunk
        end = min(16384, begin + chunk)
        changes = 0
        for stream in range(STREAMS):
            p, k, blk = begin + stream, 0, (begin + stream) // BLOCK
            while True:
                k, p = k + 1, p + STREAMS
                if p >= end:
                    break
                if p // BLOCK != blk:
                    changes += k >= 2  # positions 0 and 1 of a stream are loaded before the wait
                    blk = p // BLOCK
        print("split %2d excess %+.2f us: first slot %3d, block changes inside the loop %2d" % (s, excess[s], begin % BLOCK, changes))


if __name__ == "__main__":
    main()

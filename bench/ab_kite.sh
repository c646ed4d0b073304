#!/usr/bin/env bash
# Same-machine A/B of kite builds through `kite bench` itself (every row gated against the CPU oracle), on the
# GPU machine. The builds run alternately, round after round, so the drift of one lent machine falls on all alike.
#   AB="before:DIR_A after:DIR_B" [ROUNDS=2] [SETS="decode batched 1.7b"] bash bench/ab_kite.sh
# Each DIR holds a `kite` binary. Sets: decode = the default 0.6B rows (pp256, pp2048, tg128 at depths 256 and
# 16,384); batched = tg128 at B = 8, 32, 128 after 256 tokens; 1.7b = pp2048 and tg128 of Qwen3-1.7B.
# Writes ${OUT:-/tmp/kite-out}/ab-kite.jsonl (every row of every round, with "entry" and "round" added) and
# ab-kite-summary.txt: per row the median tok/s of the rounds per build and each build's change against the first.
set -uo pipefail
out=${OUT:-/tmp/kite-out}
mkdir -p "$out"
rounds=${ROUNDS:-2}
sets=${SETS:-"decode batched 1.7b"}
[ -n "${AB:-}" ] || { echo "AB=\"name:dir name:dir ...\" is required" >&2; exit 2; }
raw="$out/ab-kite.jsonl"
: >"$raw"
set_args() {
  case $1 in
    decode) echo "--dummy qwen3-0.6b-base -p 256,2048 -n 128 --depth 256,16384" ;;
    batched) echo "--dummy qwen3-0.6b-base -p 0 -n 128 -b 8,32,128 --depth 256" ;;
    1.7b) echo "--dummy qwen3-1.7b-base -p 2048 -n 128 --depth 256" ;;
    *) echo "ab_kite: unknown set $1" >&2; return 1 ;;
  esac
}
for round in $(seq 1 "$rounds"); do
  for set in $sets; do
    for pair in $AB; do
      IFS=: read -r name dir <<<"$pair"
      args=$(set_args "$set") || exit 2
      log=$(mktemp)
      # shellcheck disable=SC2086
      if ! timeout 300 "$dir/kite" bench $args -o jsonl >"$log" 2>&1; then
        echo "ab_kite: $name $set round $round failed: $(tail -2 "$log")" | tee -a "$out/ab-kite-errors.txt" >&2
      fi
      grep '^{' "$log" | python3 -c '
import json, sys
name, round_ = sys.argv[1], int(sys.argv[2])
for line in sys.stdin:
    row = json.loads(line); row["entry"] = name; row["round"] = round_; print(json.dumps(row))' "$name" "$round" >>"$raw"
      rm -f "$log"
    done
  done
done
python3 - "$raw" "$AB" <<'EOF' | tee "$out/ab-kite-summary.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
names = [p.split(":")[0] for p in sys.argv[2].split()]
by = {}
order = []
for r in rows:
    key = (r["model"], r["test"], r["batch"], r["depth"])
    if key not in by: order.append(key)
    by.setdefault(key, {}).setdefault(r["entry"], []).append(r["tok_s"] if r.get("gate") == "pass" else float("nan"))
print("%-40s" % "tok/s, median of rounds" + "".join("%22s" % n for n in names))
for key in order:
    label = "%s %s B=%d depth=%d" % (key[0].replace("qwen3-", "").replace("-base", ""), key[1], key[2], key[3])
    cells, base = [], None
    for i, n in enumerate(names):
        v = by[key].get(n)
        if not v: cells.append("%22s" % "-"); continue
        m = statistics.median(v)
        if i == 0: base = m; cells.append("%22.1f" % m)
        else: cells.append("%14.1f %+6.2f%%" % (m, 100 * (m - base) / base) if base else "%22.1f" % m)
    print("%-40s" % label + "".join(cells))
EOF
